import os, sys, torch, torch.distributed as dist
steps, products, slow = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
nvtx = torch.cuda.nvtx
nvtx.mark(f"rank {rank}")
a = torch.randn(4096, 4096, device="cuda")
token = torch.zeros(1)
for step in range(steps):
    with nvtx.range("step"):
        for _ in range(products * (3 if rank == slow else 1)):
            b = a @ a
        torch.cuda.synchronize()
        with nvtx.range("sync"):
            dist.all_reduce(token)
dist.destroy_process_group()
print("rank", rank, "done:", steps, "steps,", products * (3 if rank == slow else 1), "products each", flush=True)
