#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""The golden loss curve changes only by an explicit regeneration, committed alone with its reason.

A commit that touches tests/assets/losses/ must touch nothing else (so drift from a refactor cannot hide
in a curve regenerated beside it) and its message must read

    golden loss curve regenerated: <why the math, data or tokenizer changed>

    <the writer's printout: every step old -> new, and max |new - old|>

The writer (`TITAN_WRITE_GOLDEN=1 build/bin/titan_tests "write the golden loss curve"`) prints that text.
Commits made before this rule existed (before this script was added) are not checked.

  scripts/check_golden_commits.py [--repo DIR]     # exit 1 naming each commit that breaks the rule
  scripts/check_golden_commits.py --self-test      # builds a scratch repository with a bad commit and a good one
"""
import argparse
import os
import subprocess
import sys
import tempfile

GOLDEN_DIR = "tests/assets/losses/"
SUBJECT = "golden loss curve regenerated:"
PRINTOUT = "max |new - old|"
SELF = "scripts/check_golden_commits.py"


def git(repo, *args):
    return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True, check=True).stdout


def problems(repo):
    try:
        git(repo, "rev-parse", "--git-dir")
    except (OSError, subprocess.CalledProcessError):
        return [f"{repo} is not a git work tree: the rule is checked on the history, so run from a clone"]
    added = git(repo, "log", "--format=%H", "--diff-filter=A", "--", SELF).split()
    start = added[-1] if added else None
    revs = f"{start}..HEAD" if start else "HEAD"
    found = []
    for sha in git(repo, "log", "--format=%H", revs, "--", GOLDEN_DIR).split():
        files = [f for f in git(repo, "show", "--format=", "--name-only", sha).splitlines() if f]
        message = git(repo, "show", "-s", "--format=%B", sha)
        subject = message.splitlines()[0] if message else ""
        others = [f for f in files if not f.startswith(GOLDEN_DIR)]
        if others:
            found.append(f"{sha[:10]} changes the golden curve together with {', '.join(others[:5])}: "
                         "commit the regenerated curve alone")
        reason = subject[len(SUBJECT):].strip() if subject.startswith(SUBJECT) else ""
        if not reason:
            found.append(f"{sha[:10]} changes the golden curve but its subject is '{subject}': "
                         f"expected '{SUBJECT} <reason>'")
        if PRINTOUT not in message:
            found.append(f"{sha[:10]} changes the golden curve without the writer's old -> new printout "
                         f"('{PRINTOUT}') in its message")
    return found


def self_test():
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
                   GIT_COMMITTER_EMAIL="t@t")

        def commit(files, message):
            for path, text in files.items():
                os.makedirs(os.path.dirname(os.path.join(d, path)), exist_ok=True)
                with open(os.path.join(d, path), "w") as f:
                    f.write(text)
                subprocess.run(["git", "-C", d, "add", path], check=True, env=env)
            subprocess.run(["git", "-C", d, "commit", "-qm", message], check=True, env=env)

        subprocess.run(["git", "init", "-q", d], check=True, env=env)
        golden = GOLDEN_DIR + "curve.txt"
        commit({golden: "1 8.0\n", "src/a.cpp": "a"}, "before the rule: anything goes")
        commit({SELF: "rule"}, "the rule")
        commit({golden: "1 8.1\n"}, f"{SUBJECT} new tokenizer\n\nstep 1: 8.0 -> 8.1\n{PRINTOUT}: 0.1")
        if problems(d):
            return f"a good regeneration was refused: {problems(d)}"
        commit({golden: "1 8.2\n", "src/a.cpp": "b"}, "refactor parallelize")
        found = problems(d)
        if len(found) != 3 or "together with src/a.cpp" not in found[0]:
            return f"a regeneration inside a refactor was not named as expected: {found}"
    return None


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repo", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p.add_argument("--self-test", action="store_true")
    o = p.parse_args()
    if o.self_test:
        failure = self_test()
        print(failure or "self-test: a good regeneration passes; one inside a refactor is named three ways")
        return 1 if failure else 0
    found = problems(o.repo)
    for line in found:
        print(f"[check_golden_commits] {line}")
    if not found:
        print("golden curve: every change since the rule was a lone, explained regeneration")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
