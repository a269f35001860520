"""The files of a run folder are untrusted input (issue 26): nothing is written through a
symbolic link, damaged or foreign record rows are refused on resume (checksums), a damaged
``.npy`` header, a full disk and other OS errors give one clear line naming the file, and a
folder name with a control character is refused before anything is created.  Each test here
failed on the code before these rules; the runs that go on afterwards resume bit for bit."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import nrpt
from nrpt.run import cli
from nrpt.run import folder as runfolder

#: a small, fast run: 200 iterations, checkpoints every 50
OPTS = dict(chains=4, iterations=200, seed=5, checkpoint_every=50, figures=False)
ARGS = ["run", "--target", "twenty-five-modes", "--chains", "4", "--iterations", "200",
        "--seed", "5", "--checkpoint-every", "50", "--figures", "false", "--no-progress"]


def run(out: Path, **over):
    return nrpt.sample("twenty-five-modes", out=str(out), progress=False, **{**OPTS, **over})


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    out = tmp_path_factory.mktemp("files") / "run"
    run(out)
    return out


@pytest.fixture
def folder(template, tmp_path):
    """A fresh copy of a finished 200-iteration run (resumed to 300 iterations by the tests:
    its 200 rows are kept, checked against the checkpoint)."""
    return Path(shutil.copytree(template, tmp_path / "run"))


def flip(path: Path, byte: int, bit: int = 0) -> None:
    data = bytearray(path.read_bytes())
    data[byte] ^= 1 << bit
    path.write_bytes(bytes(data))


def offset(path: Path) -> int:
    with open(path, "rb") as fh:
        np.lib.format.read_magic(fh)
        np.lib.format.read_array_header_1_0(fh)
        return fh.tell()


# ------------------------------------------------------------------ 2, 3: no write through a link
def test_a_symlinked_lock_is_refused_and_its_target_untouched(tmp_path):
    precious = tmp_path / "precious"
    precious.write_bytes(b"keep me\n" * 100)
    out = tmp_path / "run"
    out.mkdir()
    (out / runfolder.LOCK).symlink_to(precious)
    with pytest.raises(ValueError, match=r"\.nrpt\.lock: it is a symbolic link"):
        run(out)
    assert precious.read_bytes() == b"keep me\n" * 100


def test_a_hard_linked_lock_is_refused(tmp_path):
    precious = tmp_path / "precious"
    precious.write_bytes(b"keep me\n")
    out = tmp_path / "run"
    out.mkdir()
    os.link(precious, out / runfolder.LOCK)
    with pytest.raises(ValueError, match="hard links"):
        run(out)
    assert precious.read_bytes() == b"keep me\n"


@pytest.mark.parametrize("name", runfolder.RECORD_FILES)
def test_a_symlinked_record_file_is_refused_on_resume_and_the_outside_file_untouched(
        folder, tmp_path, name):
    outside = tmp_path / f"outside-{name}"
    shutil.move(folder / name, outside)
    (folder / name).symlink_to(outside)
    before = outside.read_bytes()
    with pytest.raises(ValueError, match=rf"{name}: it is a symbolic link"):
        nrpt.resume(folder, iterations=300, progress=False)
    assert outside.read_bytes() == before


def test_a_dangling_record_link_in_a_new_run_is_refused(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "samples.npy").symlink_to(tmp_path / "created-outside.npy")
    with pytest.raises(ValueError, match="samples.npy: it is a symbolic link"):
        run(out)
    assert not (tmp_path / "created-outside.npy").exists()


# ------------------------------------------------------------------ 4: checksums of the rows
@pytest.mark.parametrize("name, row", [("samples.npy", 10), ("energies.npy", 199),
                                       ("index.npy", 0)])
def test_a_flipped_bit_in_a_valid_row_is_refused_on_resume(folder, name, row):
    path = folder / name
    arr = np.load(path)
    row_bytes = arr[0].nbytes if arr.ndim > 1 else arr.itemsize
    flip(path, offset(path) + row * row_bytes + 1, bit=3)
    assert not np.array_equal(np.load(path), arr)  # the damage is real
    for _ in range(2):  # refused, and refused again: nothing was "repaired" into the file
        with pytest.raises(ValueError, match=rf"{name} rows \d+\.\.\d+ do not match the "
                                             rf"checksum"):
            nrpt.resume(folder, iterations=300, progress=False)


def test_a_record_file_from_another_run_is_refused(folder, tmp_path):
    other = tmp_path / "other"
    run(other, seed=6)
    shutil.copy(other / "samples.npy", folder / "samples.npy")
    with pytest.raises(ValueError, match=r"samples.npy rows .* another run"):
        nrpt.resume(folder, iterations=300, progress=False)


def test_an_undamaged_folder_resumes_and_keeps_its_rows(folder, template):
    """(The positive side of the checksum tests: the same resumption without damage runs and
    keeps the run's 200 rows.)"""
    nrpt.resume(folder, iterations=300, progress=False)
    for name in runfolder.RECORD_FILES:
        old, new = np.load(template / name), np.load(folder / name)
        assert len(new) == len(old) + 100 and np.array_equal(new[:len(old)], old), name


# ------------------------------------------------------------------ 13: a damaged header
@pytest.mark.parametrize("byte, bit", [(10, 0), (11, 2), (60, 0), (25, 2)])
def test_a_flipped_byte_in_a_npy_header_is_a_clear_error(folder, capsys, byte, bit):
    """(These flips gave a raw tokenize.TokenError traceback: the dict's brace, a quote, the
    shape's parenthesis, a comma.)"""
    path = folder / "samples.npy"
    assert chr(path.read_bytes()[byte]) in "{'(,"
    flip(path, byte, bit)
    code = cli.main(["resume", str(folder), "--iterations", "300", "--no-progress"])
    err = capsys.readouterr().err
    assert code != 0
    assert "samples.npy" in err and "Traceback" not in err
    assert err.count("\n") == 1


# ------------------------------------------------------------------ 9: a full disk
def test_a_full_disk_is_a_clear_error_and_the_folder_resumes_exactly(tmp_path, monkeypatch,
                                                                     capsys):
    """ENOSPC while a checkpoint is written (simulated at fsync, where a full disk shows):
    one line naming the file and the remedy, exit status 1, and after "freeing space" the
    folder resumes to the same draws as an uninterrupted run."""
    real = os.fsync
    calls = {"n": 0}

    def fsync(fd):
        calls["n"] += 1
        if calls["n"] > 6:  # after the first checkpoints
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd)

    out = tmp_path / "run"
    monkeypatch.setattr(os, "fsync", fsync)
    code = cli.main([*ARGS, "--out", str(out)])
    monkeypatch.setattr(os, "fsync", real)
    err = capsys.readouterr().err
    assert code == 1
    assert "checkpoint" in err and "No space left on device" in err
    assert f"nrpt resume {out}" in err and "Traceback" not in err
    assert cli.main(["resume", str(out), "--no-progress"]) == 0
    run(tmp_path / "ref")
    for name in runfolder.RECORD_FILES:
        assert np.array_equal(np.load(out / name), np.load(tmp_path / "ref" / name)), name


def test_a_posterior_that_does_not_fit_fails_clearly_then_resumes(tmp_path, monkeypatch,
                                                                  capsys):
    """HDF5 reports a full disk as a RuntimeError: it was swallowed (the summary printed as if
    all was well, then the process crashed); now the run stops with the file named."""
    from nrpt.report import text as report

    def full(*args, **kwargs):
        raise RuntimeError("Can't write data (file write failed: errno = 28, error message = "
                           "'No space left on device')")

    out = tmp_path / "run"
    monkeypatch.setattr(report, "export_inference_data", full)
    code = cli.main([*ARGS, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 1 and "posterior.nc" in err and f"nrpt resume {out}" in err
    assert not (out / "summary.json").exists()
    monkeypatch.undo()
    assert cli.main(["resume", str(out), "--no-progress"]) == 0
    assert (out / "summary.json").exists()


def test_record_files_are_allocated_when_created(tmp_path, monkeypatch):
    """A full disk shows when a record file is created or grown (posix_fallocate), as an
    OSError naming it -- not as a SIGBUS when a write into its memory map finds no block."""
    if not hasattr(os, "posix_fallocate"):
        pytest.skip("no posix_fallocate")

    def fallocate(fd, off, n):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", fallocate)
    with pytest.raises(OSError, match="No space left") as info:
        run(tmp_path / "run")
    assert info.value.filename.endswith(".npy")


# ------------------------------------------------------------------ 10, 14: names and OS errors
@pytest.mark.parametrize("name", ["a\nb", "tab\there", "esc\x1b[31m", "nul\x7f"])
def test_a_folder_name_with_a_control_character_is_refused_before_anything_is_created(
        tmp_path, capsys, name):
    out = tmp_path / "parent" / name
    with pytest.raises(ValueError, match="control character"):
        run(out)
    assert not (tmp_path / "parent").exists()
    assert cli.main([*ARGS, "--out", str(out)]) == 2
    assert "control character" in capsys.readouterr().err
    assert not (tmp_path / "parent").exists()


@pytest.mark.parametrize("case", ["too long", "read-only"])
def test_os_errors_are_one_clear_line(tmp_path, capsys, monkeypatch, case):
    if case == "too long":
        out, words = tmp_path / ("x" * 300), "File name too long"
    else:  # (as a read-only file system answers; root passes any permission check)
        def mkdir(self, *args, **kwargs):
            raise OSError(errno.EROFS, "Read-only file system", str(self))

        monkeypatch.setattr(Path, "mkdir", mkdir)
        out, words = tmp_path / "run", "Read-only file system"
    code = cli.main([*ARGS, "--out", str(out)])
    err = capsys.readouterr().err
    assert code != 0 and words in err and "Traceback" not in err
    assert err.startswith("nrpt: error: ") and err.count("\n") == 1


def test_a_pickle_in_a_deep_runs_pretrained_file_is_refused_clearly(tmp_path):
    """(``pretrained.pt`` of ``nrpt deep --resume`` went to ``torch.load`` directly: a raw
    UnpicklingError traceback.)"""
    import pickle

    path = tmp_path / "pretrained.pt"
    path.write_bytes(pickle.dumps(_Evil()))
    with pytest.raises(runfolder.UnsafeCheckpoint, match=r"refusing to load .*pretrained.pt"):
        runfolder.load_weights(path)
    assert not (tmp_path / "ran").exists()
    path.write_bytes(b"not a tensor file")
    with pytest.raises(ValueError, match="pretrained.pt"):  # (torch: an UnpicklingError too)
        runfolder.load_weights(path)


class _Evil:
    def __reduce__(self):
        return (Path.touch, (Path(os.environ.get("NRPT_FILES_MARKER", "/nonexistent/ran")),))


def test_damage_after_the_checkpoints_rows_is_written_over(folder, template, tmp_path):
    """Rows after the checkpoint's (as a kill -9 leaves them) are not kept: garbage there is
    replaced by the resumed run's draws, the same as in an undamaged folder."""
    clean = Path(shutil.copytree(template, tmp_path / "clean"))
    nrpt.resume(clean, iterations=300, progress=False)
    arr = np.load(folder / "samples.npy")
    np.save(folder / "samples.npy", np.concatenate([arr, np.full((100, arr.shape[1]), 9e-155)]))
    nrpt.resume(folder, iterations=300, progress=False)
    for name in runfolder.RECORD_FILES:
        assert np.array_equal(np.load(folder / name), np.load(clean / name)), name
