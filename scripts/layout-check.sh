#!/usr/bin/env bash
# Checks that every row of src/python/layouts/table.rs is what its CPython's
# own headers say: regenerates each row with scripts/layout-offsets.sh from
# the headers scripts/pythons.sh provides (every version the table has a
# row for) and compares them, field by field. Fails on a row that differs,
# a row no headers here regenerate, and headers with no row. With --write it
# rewrites the table from the headers instead.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
table=$here/../src/python/layouts/table.rs
mapfile -t prefixes < <("$here/pythons.sh" headers)
generated=$(mktemp)
trap 'rm -f "$generated"' EXIT
"$here/layout-offsets.sh" "${prefixes[@]}" > "$generated"
python3 - "$table" "$generated" "${1:-}" <<'PY'
import difflib, re, sys

table_path, generated_path, mode = sys.argv[1], sys.argv[2], sys.argv[3]

def rows(text):
    """Each row as (key, comment, body lines), the key its version and build."""
    out = {}
    # A row ends at the brace as deep as its comment (nested structs close deeper).
    for m in re.finditer(r"^( *)(// CPython (\S+), from its headers[^\n]*)\n(.*?^\1\}),?$", text, re.S | re.M):
        body = [line.strip() for line in m.group(4).splitlines()]
        version = next(l for l in body if l.startswith("version: ("))
        free = next(l for l in body if l.startswith("free_threaded:"))
        key = (version, "free-threaded" if "true" in free else "default build")
        if key in out:
            sys.exit(f"layout-check: two rows for {key}")
        out[key] = (m.group(3), m.group(2).strip(), body)
    return out

table_text = open(table_path).read()
table, generated = rows(table_text), rows(open(generated_path).read())
if mode == "--write":
    def indent(comment, body):
        depth, lines = 1, [f"    {comment}"]
        for line in body:
            depth -= line.startswith("}")
            lines.append("    " * depth + line)
            depth += line.endswith("{")
        lines[-1] += ","
        return "\n".join(lines)
    order = sorted(generated, key=lambda k: (tuple(map(int, re.findall(r"\d+", k[0]))), k[1] == "free-threaded"))
    body = "\n".join(indent(generated[k][1], generated[k][2]) for k in order)
    start = table_text.index("pub static LAYOUTS: &[Layout] = &[\n") + len("pub static LAYOUTS: &[Layout] = &[\n")
    end = table_text.index("\n];", start)
    open(table_path, "w").write(table_text[:start] + body + table_text[end:])
    print(f"layout-check: wrote {len(order)} rows to {table_path}")
    sys.exit(0)
failed = False
for key, (version, _, body) in sorted(table.items()):
    if key not in generated:
        print(f"layout-check: the row for CPython {version} ({key[1]}) has no headers here to check it against")
        failed = True
        continue
    made_from, _, fresh = generated[key]
    if fresh != body:
        print(f"layout-check: the row for CPython {version} ({key[1]}) differs from what CPython {made_from}'s headers say:")
        for line in difflib.unified_diff(body, fresh, "table", "headers", n=0, lineterm=""):
            print(f"    {line}")
        failed = True
    else:
        note = "" if made_from == version else f" (headers of {made_from})"
        print(f"layout-check: CPython {version} ({key[1]}): {len(body)} lines agree{note}")
for key, (version, _, _) in generated.items():
    if key not in table:
        print(f"layout-check: CPython {version} ({key[1]}) has headers here and no row in the table")
        failed = True
sys.exit(1 if failed else 0)
PY
