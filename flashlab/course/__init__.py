"""flashlab.course -- producing the book: figures, the site, assignments and their grader.

It imports the teaching core and the lab (recorded results); neither imports it.
  figures/        every figure of the book, one function each (``python -m flashlab.course.figures``)
  show            short excerpts of the package's source for the chapters
  site            builds the website with a local MathJax
  assignments     student versions of the exercises and the grader (``make grade``)
  claims          every number of the source material and where the book checks it
  run_notebooks   every chapter executed top to bottom on this machine, outcome recorded
"""
