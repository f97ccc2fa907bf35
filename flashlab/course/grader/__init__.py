"""The exercises' grader: student versions, and grading untrusted submissions.

  notebook   the authoring convention (solution and tests cells), :func:`build` with nbgrader
  grading    :func:`grade` a folder of submissions into CSVs and feedback, :func:`grade_variants` for the banks
  session    one submission's kernel, in its sandbox, and the checks that run outside it
  sandbox    bubblewrap, resource limits, and the package copy the sandbox sees
  codec      values as data: all that comes back from a submission's kernel
  probes     how an answer computes (which ufuncs, which calls), asked of the student's kernel
  served     the held functions: forbidden package functions, run by the grader on request
  policy     what a submission's own cells may contain, checked before the notebook runs

``python -m flashlab.course.assignments`` is the command line.
"""

from .grading import (
    DEFAULT_CELL_TIMEOUT_S,
    DEFAULT_NOTEBOOK_TIMEOUT_S,
    GRADE_COLUMNS,
    STATUSES,
    Score,
    VariantResult,
    feedback_text,
    find_submissions,
    grade,
    grade_notebook,
    grade_variants,
    load_extra_tests,
    new_salt,
    outputs_of,
    summary_rows,
)
from .notebook import (
    BEGIN_HIDDEN,
    BEGIN_SOLUTION,
    COURSE_ID,
    END_HIDDEN,
    END_SOLUTION,
    NOTEBOOKS_DIR,
    REPO_ROOT,
    Chapter,
    Exercise,
    build,
    exercises,
    replace_solution_body,
    solution_body,
    strip_hidden_tests,
)
from .sandbox import SandboxUnavailable

__all__ = [
    "BEGIN_HIDDEN", "BEGIN_SOLUTION", "COURSE_ID", "DEFAULT_CELL_TIMEOUT_S", "DEFAULT_NOTEBOOK_TIMEOUT_S",
    "END_HIDDEN", "END_SOLUTION", "GRADE_COLUMNS", "NOTEBOOKS_DIR", "REPO_ROOT", "STATUSES", "Chapter",
    "Exercise", "SandboxUnavailable", "Score", "VariantResult", "build", "exercises", "feedback_text",
    "find_submissions", "grade", "grade_notebook", "grade_variants", "load_extra_tests", "new_salt",
    "outputs_of",
    "replace_solution_body", "solution_body", "strip_hidden_tests", "summary_rows",
]
