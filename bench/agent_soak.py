"""pytrace agent's own cost over a long run (issue #26): 20 steady Python
services (each working 2 ms in every 100 ms) and a churn of short-lived
Pythons (one started every 2 s, living 1 s), under `pytrace agent` at
19 Hz with 15 s intervals into a directory. Every minute /metrics is read:
the agent's CPU time and RSS. Prints a Markdown table and a summary line.

    python3 bench/agent_soak.py MINUTES [PYTRACE]

Run as root; on demand, not in CI.
"""
import os
import socket
import subprocess
import sys
import tempfile
import time

minutes = float(sys.argv[1])
pytrace = sys.argv[2] if len(sys.argv) > 2 else "target/release/pytrace"
python = "/usr/bin/python3.11"
STEADY = "import time\nwhile True:\n    end = time.process_time() + 0.002\n    while time.process_time() < end: pass\n    time.sleep(0.098)\n"
SHORT = "import time\nend = time.monotonic() + 1\nwhile time.monotonic() < end: time.sleep(0.01)\n"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def metrics(port):
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        text = b""
        while chunk := s.recv(65536):
            text += chunk
    values = {}
    for line in text.decode().split("\r\n\r\n", 1)[1].splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            values[key] = float(value)
    return values


work = tempfile.mkdtemp()
port = free_port()
with open(os.path.join(work, "agent.toml"), "w") as f:
    f.write(f'frequency = 19\ninterval = "15s"\n[metrics]\naddress = "127.0.0.1:{port}"\n'
            f'[[destinations]]\nkind = "directory"\npath = "{work}/profiles"\nmax_size = "20MiB"\n')
services = [subprocess.Popen([python, "-c", STEADY], env=dict(os.environ, OTEL_SERVICE_NAME=f"steady-{i}")) for i in range(20)]
agent = subprocess.Popen([pytrace, "agent", "--config", os.path.join(work, "agent.toml")], stderr=open(os.path.join(work, "agent.log"), "w"))
rows = []
short = []
started = time.monotonic()
next_row = started + 60
try:
    time.sleep(3)
    while time.monotonic() - started < minutes * 60:
        short = [p for p in short if p.poll() is None]
        short.append(subprocess.Popen([python, "-c", SHORT]))
        time.sleep(2)
        if time.monotonic() >= next_row:
            next_row += 60
            m = metrics(port)
            rows.append((round((time.monotonic() - started) / 60), m["process_cpu_seconds_total"], m["process_resident_memory_bytes"] / 2**20,
                         m["pytrace_agent_profiles_total"], m["pytrace_agent_samples_total"]))
finally:
    agent.terminate()
    agent.wait()
    for p in services + short:
        p.kill()
        p.wait()
print("| minute | agent CPU (s, total) | CPU over the last minute | RSS (MiB) | profiles | samples |")
print("|---|---|---|---|---|---|")
last = 0.0
for minute, cpu, rss, profiles, samples in rows:
    print(f"| {minute} | {cpu:.2f} | {100 * (cpu - last) / 60:.2f} % | {rss:.1f} | {profiles:.0f} | {samples:.0f} |")
    last = cpu
if len(rows) > 1:
    (m0, c0, r0, _, _), (m1, c1, r1, _, _) = rows[0], rows[-1]
    print(f"\nAfter warm-up (minute {m0} to {m1}): {100 * (c1 - c0) / ((m1 - m0) * 60):.2f} % of one CPU; RSS {r0:.1f} → {r1:.1f} MiB.")
