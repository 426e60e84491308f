import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.executable, [sys.executable] + sys.argv[1:])
_, status = os.waitpid(pid, 0)
print("parent done, child status", status, flush=True)
sys.exit(os.waitstatus_to_exitcode(status))
