"""gkd-train's one-line failure names a rank's own error under torchrun, whose multi-rank output prefixes every
line of a rank with ``[rankN]: `` (before, the line was torchrun's ChildFailedError: the rank's error, e.g. the
run folder check's, was missed)."""

from gkd_harness.harness.launcher.process import _last_error_line

LOG = """[gkd-harness] installed loss precision=original
[rank0]: Traceback (most recent call last):
[rank0]:   File "/x/callbacks.py", line 80, in check_run_folder_shared
[rank0]:     raise RunFolderNotSharedError(
[rank0]: gkd_harness.harness.rank.callbacks.RunFolderNotSharedError: run folder /r is not shared by the 2 nodes: set run.output_dir
E1201 23:10:00 torch/distributed/elastic/multiprocessing/api.py:882] failed (exitcode: 1)
Traceback (most recent call last):
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
"""


def test_rank_prefixed_error_is_the_reported_line(tmp_path):
    log = tmp_path / "swift.log"
    log.write_text(LOG)
    assert _last_error_line(log) == (
        "gkd_harness.harness.rank.callbacks.RunFolderNotSharedError: run folder /r is not shared "
        "by the 2 nodes: set run.output_dir"
    )


def test_unprefixed_error_still_found(tmp_path):
    log = tmp_path / "swift.log"
    log.write_text("Traceback (most recent call last):\nValueError: bad value\n")
    assert _last_error_line(log) == "ValueError: bad value"
