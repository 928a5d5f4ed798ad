#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""The golden loss curves change only by an explicit regeneration, committed alone with its reason.

A commit that touches a golden curve (GOLDEN below) must touch nothing but golden curves (so drift from a
refactor cannot hide in a curve regenerated beside it) and its message must read

    golden loss curve regenerated: <why the math, data or tokenizer changed>

    <the writer's printout: every step or mode old -> new, and max |new - old|>

The writers print that text: `TITAN_WRITE_GOLDEN="<reason>" build/bin/titan_tests "write the golden loss
curve"` for tests/assets/losses/, `scripts/precision_curves.py` for docs/assets/precision_curves.csv.
Each golden path is checked from the commit that put it into GOLDEN (the first commit of this script that
names it); commits before that are not.

  scripts/check_golden_commits.py [--repo DIR]     # exit 1 naming each commit that breaks the rule
  scripts/check_golden_commits.py --self-test      # builds a scratch repository with a bad commit and a good one
"""
import argparse
import os
import subprocess
import sys
import tempfile

# A folder (ending in /) or a file.
GOLDEN = ("tests/assets/losses/", "docs/assets/precision_curves.csv")
SUBJECT = "golden loss curve regenerated:"
PRINTOUT = "max |new - old|"
SELF = "scripts/check_golden_commits.py"


def git(repo, *args):
    return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True, check=True).stdout


def is_golden(path):
    return any(path == g or (g.endswith("/") and path.startswith(g)) for g in GOLDEN)


def checked_commits(repo):
    """The commits that touch a golden path since the commit that put it under the rule, newest first."""
    shas = set()
    for golden in GOLDEN:
        # -S: the commits of this script that changed how often it names the path; the oldest added it.
        named = git(repo, "log", "--format=%H", "--reverse", "-S", f'"{golden}"', "--", SELF).split()
        if not named:
            continue
        shas.update(git(repo, "log", "--format=%H", f"{named[0]}..HEAD", "--", golden).split())
    order = git(repo, "log", "--format=%H", "HEAD").split()
    return [sha for sha in order if sha in shas]


def problems(repo):
    try:
        git(repo, "rev-parse", "--git-dir")
    except (OSError, subprocess.CalledProcessError):
        return [f"{repo} is not a git work tree: the rule is checked on the history, so run from a clone"]
    found = []
    for sha in checked_commits(repo):
        files = [f for f in git(repo, "show", "--format=", "--name-only", sha).splitlines() if f]
        message = git(repo, "show", "-s", "--format=%B", sha)
        subject = message.splitlines()[0] if message else ""
        others = [f for f in files if not is_golden(f)]
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
        curve, table = GOLDEN[0] + "curve.txt", GOLDEN[1]

        def rule(*paths):
            return "GOLDEN = (" + ", ".join(f'"{p}"' for p in paths) + ")\n"

        def regenerated(why):
            return f"{SUBJECT} {why}\n\nold -> new\n{PRINTOUT}: 0.1"

        commit({curve: "1 8.0\n", table: "1,8.0\n", "src/a.cpp": "a"}, "before the rule: anything goes")
        commit({SELF: rule(GOLDEN[0])}, "the rule, for the curve")
        commit({table: "1,8.1\n", "src/a.cpp": "b"}, "the table is not under the rule yet")
        commit({curve: "1 8.1\n"}, regenerated("new tokenizer"))
        if problems(d):
            return f"a good regeneration, or a table change before its rule, was refused: {problems(d)}"
        commit({SELF: rule(*GOLDEN)}, "the rule, for the table too")
        commit({table: "1,8.2\n", curve: "1 8.2\n"}, regenerated("new init"))
        if problems(d):
            return f"a good regeneration of both curves was refused: {problems(d)}"
        commit({curve: "1 8.3\n", "src/a.cpp": "c"}, "refactor parallelize")
        commit({table: "1,8.3\n", "docs/x.md": "x"}, "docs: new table")
        found = problems(d)
        if (len(found) != 6 or "together with docs/x.md" not in found[0]
                or "together with src/a.cpp" not in found[3]):
            return f"a regeneration inside another change was not named as expected: {found}"
    return None


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repo", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p.add_argument("--self-test", action="store_true")
    o = p.parse_args()
    if o.self_test:
        failure = self_test()
        print(failure or "self-test: good regenerations pass; each curve changed inside another change is named "
              "three ways, from the commit that put it under the rule")
        return 1 if failure else 0
    found = problems(o.repo)
    for line in found:
        print(f"[check_golden_commits] {line}")
    if not found:
        print("golden curve: every change since the rule was a lone, explained regeneration")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
