#!/usr/bin/env bash
# Checks the documentation (README.md and docs/**/*.md) without building
# anything or fetching anything, so it is cheap enough to run first:
#   - every relative link and image resolves to a file of this checkout, and
#     every #anchor to a heading (GitHub's slugs) or an id= of its target;
#   - every fenced code block that runs pytrace is marked, on the line just
#     before it, as <!-- illustrative --> or <!-- tested: MODULE::NAME -->
#     (several tests separated by ", "), a test's path in the integration
#     binary (`cargo test --test integration -- --list`: MODULE::NAME, or
#     MODULE::BUILD::NAME for one over_builds! makes), and each name after
#     MODULE occurs in tests/integration/MODULE.rs. docs/testing.md explains
#     the convention.
# Prints one line per problem (FILE:LINE: what) and exits 1 if there is any.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 - "$@" <<'PYTHON'
import glob, os, re, sys, unicodedata

files = ["README.md"] + sorted(glob.glob("docs/**/*.md", recursive=True))
problems = []
SUBCOMMANDS = r"(calls|sample|compare|top|dump|gc|imports|gil|info|restore|heap|memory|agent)"
# A command line runs pytrace: the word pytrace (or a path ending in it) then a
# subcommand followed by a space or the line's end. Output lines such as
# "pytrace calls: PID 42" are not commands (a colon follows the subcommand).
COMMAND = re.compile(r"(^|[\s;&|(/])pytrace\s+" + SUBCOMMANDS + r"(\s|$)")
MARK_ILLUSTRATIVE = "<!-- illustrative -->"
MARK_TESTED = re.compile(r"^<!-- tested: (.+) -->$")
TEST_REF = re.compile(r"^(\w+)((?:::\w+)+)$")


def slug(heading):
    """GitHub's anchor for a heading: lower case, markup and punctuation
    dropped (letters, digits, spaces, '-' and '_' kept), spaces made '-'."""
    text = re.sub(r"<[^>]+>", "", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = text.strip().lower()
    kept = []
    for ch in text:
        if ch in " -_" or unicodedata.category(ch)[0] in "LN":
            kept.append(ch)
    return "".join(kept).replace(" ", "-")


def parse(path):
    """The file's lines, whether each is inside fenced code, its fenced blocks
    (index of the opening fence, of the closing one) and its anchors."""
    lines = open(path, encoding="utf-8").read().split("\n")
    in_code, blocks, fence, opened = [], [], None, 0
    for index, line in enumerate(lines):
        stripped = line.strip()
        if fence is None:
            opener = re.match(r"^(`{3,}|~{3,})", stripped)
            if opener:
                fence, opened = opener.group(1), index
            in_code.append(bool(opener))
        else:
            in_code.append(True)
            if stripped.startswith(fence) and set(stripped) == {fence[0]}:
                blocks.append((opened, index))
                fence = None
    if fence is not None:
        problems.append(f"{path}:{opened + 1}: a code fence that is never closed")
        blocks.append((opened, len(lines)))
    anchors, seen = set(), {}
    for line, code in zip(lines, in_code):
        if code:
            continue
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            base = slug(heading.group(1))
            n = seen.get(base, 0)
            anchors.add(base if n == 0 else f"{base}-{n}")
            seen[base] = n + 1
        for explicit in re.findall(r"""\b(?:id|name)=["']([^"']+)["']""", line):
            anchors.add(explicit)
    return lines, in_code, blocks, anchors


parsed = {}


def get(path):
    path = os.path.normpath(path)
    if path not in parsed:
        parsed[path] = parse(path)
    return parsed[path]


LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")

for path in files:
    lines, in_code, blocks, anchors = get(path)
    for number, (line, code) in enumerate(zip(lines, in_code), 1):
        if code:
            continue
        prose = re.sub(r"`[^`]*`", "", line)
        for target in LINK.findall(prose):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue  # http:, https:, mailto: are not checked here
            file_part, _, anchor = target.partition("#")
            if file_part:
                resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part))
                if not os.path.exists(resolved):
                    problems.append(f"{path}:{number}: link to {target}: {resolved} does not exist")
                    continue
            else:
                resolved = path
            if anchor:
                if not resolved.endswith(".md") or os.path.isdir(resolved):
                    problems.append(f"{path}:{number}: link to {target}: an anchor into a file that is not Markdown")
                    continue
                if anchor not in get(resolved)[3]:
                    problems.append(f"{path}:{number}: link to {target}: {resolved} has no heading or id '{anchor}'")

    # Command examples: each fenced block that runs pytrace must say whether
    # a test runs it.
    for start, end in blocks:
        block = lines[start + 1 : end]
        if not any(COMMAND.search(l) for l in block):
            continue
        previous = start - 1
        while previous >= 0 and not lines[previous].strip():
            previous -= 1
        mark = lines[previous].strip() if previous >= 0 else ""
        where = f"{path}:{start + 1}"
        if mark == MARK_ILLUSTRATIVE:
            continue
        tested = MARK_TESTED.match(mark)
        if not tested:
            problems.append(f"{where}: a pytrace command block needs {MARK_ILLUSTRATIVE} or <!-- tested: MODULE::NAME --> on the line before it")
            continue
        for ref in tested.group(1).split(", "):
            m = TEST_REF.match(ref.strip())
            if not m:
                problems.append(f"{where}: '{ref}' is not MODULE::NAME")
                continue
            module, names = m.groups()
            test_file = f"tests/integration/{module}.rs"
            if not os.path.isfile(test_file):
                problems.append(f"{where}: {test_file} does not exist")
                continue
            text = open(test_file, encoding="utf-8").read()
            for name in names.split("::")[1:]:
                if not re.search(r"\b" + re.escape(name) + r"\b", text):
                    problems.append(f"{where}: no {name} in {test_file}, so no test {ref}")

    # An indented code block is not checked above: commands must be fenced.
    for number, (line, code) in enumerate(zip(lines, in_code), 1):
        if not code and line.startswith("    ") and COMMAND.search(line) and (number < 2 or not lines[number - 2].strip() or lines[number - 2].startswith("    ")):
            problems.append(f"{path}:{number}: a pytrace command in an indented block: fence it (```sh) and mark it")

for problem in problems:
    print(problem)
if problems:
    print(f"docs-check: {len(problems)} problem(s) in {len(files)} files", file=sys.stderr)
    sys.exit(1)
print(f"docs-check: {len(files)} files, every relative link and anchor resolves, every pytrace block is marked", file=sys.stderr)
PYTHON
