"""flashlab.course.show quotes the package's source for the chapters, and refuses stale markers."""

import pytest

from flashlab.course import show


def test_source_cuts_between_markers_and_drops_the_docstring():
    loop = show.source("kernels/forward.py", "_attend", start="for start_n", quiet=True)
    assert loop.lstrip().startswith("for start_n") and "def _attend" not in loop
    body = show.source("kernels/forward.py", "online_softmax_step", body=True, quiet=True)
    assert "m_new = tl.maximum" in body and '"""' not in body and "def online_softmax_step" not in body
    assert body.lstrip().startswith("# S_ij")  # the comment above the first statement is kept
    head = show.source("kernels/forward.py", "online_softmax_step", stop="m_new =", quiet=True)
    assert head.startswith("@triton.jit") or head.startswith("def online_softmax_step")


def test_docstring_of_module_and_function(capsys):
    text = show.docstring("kernels/backward.py", start="Two ways to get dQ", stop="For GQA")
    assert text.startswith("Two ways to get dQ") and "For GQA" not in text
    assert capsys.readouterr().out.strip() == text.strip()
    assert "running state" in show.docstring("kernels/forward.py", "online_softmax_step", quiet=True)


@pytest.mark.parametrize("call, words", [
    (lambda: show.source("kernels/nothere.py", "f"), ["path must name a file", "nothere.py"]),
    (lambda: show.source("kernels/forward.py", "no_such_function"), ["name must be a top-level", "no_such_function"]),
    (lambda: show.source("kernels/forward.py", "_attend", start="no such line"), ["start marker", "no such line"]),
    (lambda: show.docstring("kernels/forward.py", start="x", stop="no such stop"), ["stop marker"]),
])
def test_stale_names_and_markers_are_errors(call, words):
    with pytest.raises(ValueError) as info:
        call()
    assert all(w in str(info.value) for w in words)


def test_excerpt_is_short_dedented_and_refuses_a_whole_function():
    text = show.excerpt("kernels/forward.py", "online_softmax_step", start="m_new =", quiet=True)
    assert text.startswith("m_new =") and len(text.splitlines()) <= show.EXCERPT_LINES
    assert max(map(len, text.splitlines())) <= show.EXCERPT_WIDTH
    assert show._comment_above("    x = 1  # " + "n" * 100) == ["    # " + "n" * 100, "    x = 1"]
    with pytest.raises(ValueError, match="at most 20 lines"):
        show.excerpt("kernels/fa3.py", "_consumer", body=False, quiet=True)


def test_excerpt_leaves_out_the_kernels_time_stamps():
    whole = show.source("kernels/fa3.py", "_consumer", start="for j in range(1, n_blocks):",
                        stop="last =", quiet=True)
    shown = show.excerpt("kernels/fa3.py", "_consumer", start='# "wait for K_j; S_next',
                         stop="# \"rescale O_i\"", quiet=True)
    assert "_stamp(" in whole and "_stamp(" not in shown and "_take_turn" in shown
