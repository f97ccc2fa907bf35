"""Discrete-event models of GPU units; they import only :mod:`flashlab.hardware` and :mod:`flashlab.reference`.

- :mod:`.events`    — one SM's load engine (TMA), tensor core and exp unit (MUFU) as
  resources; task graphs for FA2/FA3 schedules (serial, producer-consumer ring buffer,
  ping-pong, intra-warpgroup pipelining); timelines and tensor-core utilisation (chapter 6)
- :mod:`.occupancy` — occupancy and waves of thread blocks over the SMs (chapter 5)
"""
