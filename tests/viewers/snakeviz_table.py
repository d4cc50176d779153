"""Fetches snakeviz's page for a profile, as a browser would, and prints as
JSON the stats table it serves: {function: ncalls} with snakeviz's own
labels ("file:line(name)") and ncalls text ("21/1" for recursion).

    python3 snakeviz_table.py URL
"""
import ast
import json
import sys
import urllib.request

page = urllib.request.urlopen(sys.argv[1], timeout=30).read().decode()
start = page.index("var table_data = ") + len("var table_data = ")
end = page.index(";\n", start)
# Each row: [[ncalls, sort key], tottime, percall, cumtime, percall, short name, full name].
rows = ast.literal_eval(page[start:end])
print(json.dumps({row[6]: row[0][0] for row in rows}))
