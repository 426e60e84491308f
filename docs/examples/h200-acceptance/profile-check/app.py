import contextlib, os, sys, time, torch
seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 2
nvtx = not (len(sys.argv) > 2 and sys.argv[2] == "nonvtx")
a = torch.randn(2048, 2048, device="cuda")
end = time.time() + seconds
with torch.cuda.nvtx.range("fleet-check") if nvtx else contextlib.nullcontext():
    while time.time() < end:
        b = a @ a
        torch.cuda.synchronize()
print("app done, rank", os.environ.get("RANK", os.environ.get("SLURM_PROCID")), flush=True)
