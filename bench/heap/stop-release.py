"""The experiment behind --stop in docs/design/heap.md (run by hand as root:
python3 bench/heap/stop-release.py). Does a target stopped with PTRACE_SEIZE + PTRACE_INTERRUPT run again when
its tracer is SIGKILLed? (and does SIGSTOP's stop survive its sender's death?)"""
import ctypes, os, signal, subprocess, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
SEIZE, INTERRUPT = 0x4206, 0x4207
beat = f"/tmp/pytrace-stop-release-{os.getpid()}"
target = subprocess.Popen([sys.executable, "-c", f"""
import threading, time
n = 0
def spin():
    while True: time.sleep(0.001)
threading.Thread(target=spin, daemon=True).start()
while True:
    n += 1
    open({beat!r}, "w").write(str(n)); time.sleep(0.01)
"""])
time.sleep(0.5)
def beats():
    a = open(beat).read(); time.sleep(0.3); b = open(beat).read()
    return a != b
def state(pid):
    return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
tracer = os.fork()
if tracer == 0:
    tids = [int(t) for t in os.listdir(f"/proc/{target.pid}/task")]
    for t in tids:
        assert libc.ptrace(SEIZE, t, None, None) == 0, ctypes.get_errno()
        assert libc.ptrace(INTERRUPT, t, None, None) == 0, ctypes.get_errno()
    for t in tids:
        os.waitpid(t, os.__dict__.get("WALL", 0x40000000))
    time.sleep(60)
    os._exit(0)
time.sleep(0.5)
print("seized+interrupted: running?", beats(), "threads:", [state(int(t)) for t in os.listdir(f"/proc/{target.pid}/task")])
os.kill(tracer, signal.SIGKILL); os.waitpid(tracer, 0)
time.sleep(0.2)
print("tracer SIGKILLed: running?", beats())
os.kill(target.pid, signal.SIGSTOP); time.sleep(0.2)
print("SIGSTOP: running?", beats(), "(nobody sends SIGCONT if the sender died)")
os.kill(target.pid, signal.SIGCONT); time.sleep(0.1)
print("SIGCONT: running?", beats())
target.kill()
os.unlink(beat)
