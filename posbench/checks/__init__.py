"""The contract kit: the shared tests every encoding and every task must pass, run on any of them by name.

``posbench check NAME`` runs them from the command line (one line per check, exit code 1 when one fails); from
Python or a test suite::

    from posbench.checks import check_encoding, check_task
    check_encoding("learned").assert_ok()        # AssertionError listing every failed check
    check_task("copy").assert_ok()

An encoding (``checks/encoding.py``, a tiny model on the CPU, a few seconds): its options (declared with a default,
a range and help, and refused out of range in one line), it builds and every trainable parameter reaches the loss, a
later token never changes an earlier logit, the attention backends agree, a KV cache (growing, and static as
compiled decoding uses it) equals recomputation, a saved state dict rebuilds the same model, and the model is one
``torch.compile`` graph for all its layers (traced by dynamo only, no code generation: about a second;
``compiled=False``, ``--no-compiled``, leaves it out). A task (``checks/task.py``): its options, its version, every
preset resolves, its training stream resumes exactly from its saved state, and a short run of its smallest preset
goes through the runner to a record that ``compare`` reads.
"""

from posbench.checks.outcome import Check, Report
from posbench.checks.encoding import check_encoding
from posbench.checks.task import check_task

__all__ = ["Check", "Report", "check_encoding", "check_task"]
