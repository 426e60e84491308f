"""The stand-in nsys's capture ranges: `profile --capture-range=nvtx|cudaProfilerApi` with
`--capture-range-end=stop|repeat[:N]`, as nsys 2025.3 did on an H100 test machine
(tests/fixtures/nsys-sessions-h100, nvtx-repeat and cuda-api):

  * nothing is collected outside a window; each window the workload opens prints "Capture range
    started in the application." and "... ended ...", then "Generating '$TMPDIR/nsys-report-XXXX.qdstrm'";
  * `stop`: the first window alone, its report NAME.nsys-rep; `repeat:N`: up to N windows, each
    NAME.K.nsys-rep (K from 1), each report made as its window ends (through fleet on an H100 test
    machine, docs/examples/h200-acceptance/6679068/1-windows: NAME.1 appeared 4.7 s before NAME.2,
    and both before the workload's end), "[K/N]" before each; the workload runs on after the
    windows, and nsys exits with its status, listing the reports under "Generated:" at its end;
  * a workload that never opens a window leaves no report: at its end nsys printed "Processing
    events...", "Generated:" and "No reports were generated", and exited with its status (the
    same recording, 3-never-opened.txt);
  * NVTX: a range the workload opens is a line NAME (or NAME@DOMAIN) it writes to the file named
    by $STANDIN_NVTX_LOG, once the range is over; --nvtx-capture=RANGE[@DOMAIN|@*] matches it as
    nsys's help says. The workloads here name ranges by plain strings, as torch.cuda.nvtx does,
    which open a capture range only with NSYS_NVTX_PROFILER_REGISTER_ONLY=0 in the workload's
    environment (nsys's --env-var): without it, none opens (nsys's guide: registered strings only);
  * cudaProfilerApi: the workload's cudaProfilerStart() and cudaProfilerStop() are lines "start"
    and "stop" it writes to the file named by $STANDIN_CUDA_PROFILER_LOG.

Not recorded, the stand-in's own: how long nsys holds the workload at a window's start and end
(on the H100, a 12 s workload did 2 steps under --repeat 2: seconds each), which it does not."""
import json
import os
import random
import time


class Capture:
    """A run's capture ranges: the windows the workload opened, read from its log as it writes."""

    def __init__(self, opts, env, collecting):
        self.kind = opts.get("--capture-range", "none")
        end = opts.get("--capture-range-end", "stop-shutdown")
        self.most = 1 if end.startswith("stop") else int(end.split(":", 1)[1]) if ":" in end else None
        self.repeat = end.startswith("repeat")
        self.wanted = opts.get("--nvtx-capture", "")
        self.log = collecting + (".nvtx" if self.kind == "nvtx" else ".cudaprofiler")
        self.offset, self.open_since, self.windows, self.made = 0, None, [], 0
        self.any_string = env.get("NSYS_NVTX_PROFILER_REGISTER_ONLY") == "0"
        if self.kind == "cudaProfilerApi":
            env["STANDIN_CUDA_PROFILER_LOG"] = self.log

    @property
    def on(self):
        return self.kind in ("nvtx", "cudaProfilerApi")

    @property
    def full(self):
        return self.most is not None and len(self.windows) >= self.most

    def _lines(self):
        if not os.path.exists(self.log):
            return []
        with open(self.log) as f:
            f.seek(self.offset)
            text = f.read()
        done = text[: text.rfind("\n") + 1]  # a line still being written is read next time
        self.offset += len(done)
        return [line.strip() for line in done.splitlines() if line.strip()]

    def _matches(self, line):
        name, _, domain = line.partition("@")
        want_name, at, want_domain = self.wanted.replace("\\@", "\0").partition("@")
        want_name = want_name.replace("\0", "@")
        return self.any_string and name == want_name and (want_domain == "*" or domain == (want_domain if at else ""))

    def poll(self, say):
        """The windows the workload opened since the last look, each said as nsys says it."""
        for line in self._lines():
            if self.full:
                return
            if self.kind == "nvtx" and self._matches(line):
                self._window(say, time.time() - 0.05, [line.partition("@")[0]])
            elif self.kind == "cudaProfilerApi" and line == "start" and self.open_since is None:
                self.open_since = time.time()
                say("Capture range started in the application.\n")
            elif self.kind == "cudaProfilerApi" and line == "stop" and self.open_since is not None:
                self._window(say, self.open_since, [], started_said=True)
                self.open_since = None

    def _window(self, say, since, ranges, started_said=False):
        if not started_said:
            say("Capture range started in the application.\n")
        say("Capture range ended in the application.\n")
        tmp = os.path.join(os.path.dirname(self.log), f"nsys-report-{random.randrange(16**4):04x}.qdstrm")
        say(f"Generating '{tmp}'\n")
        self.windows.append({"qdstrm": tmp, "elapsed_ns": max(1, int((time.time() - since) * 1e9)), "nvtx": ranges})

    def ready(self, app_ended):
        """Whether a report is to be made now: a window ended whose report is not made yet."""
        return self.made < len(self.windows)

    def make(self, data, base, kernels, importer, say):
        """Each window's report, from its own .qdstrm: NAME.nsys-rep, or NAME.K.nsys-rep with repeat."""
        made = []
        for k, window in enumerate(self.windows[self.made:], start=self.made + 1):
            with open(window["qdstrm"], "w") as f:
                json.dump(dict(data, duration=window["elapsed_ns"] / 1e9, kernels=kernels(window["elapsed_ns"]),
                               nvtx=[{"name": n, "time_ns": window["elapsed_ns"]} for n in window["nvtx"]],
                               exit_status=None, signalled=False, killed=False), f)
            name = f"{base}.{k}" if self.repeat else base
            if importer(window["qdstrm"], name, f"[{k}/{len(self.windows)}]"):
                made.append(name + ".nsys-rep")
        self.made = len(self.windows)
        return made
