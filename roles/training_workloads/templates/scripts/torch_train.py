"""Synthetic-data ResNet-50 training (roles/training_workloads): one process per GPU under torchrun, DDP over NCCL.

torchrun sets RANK, LOCAL_RANK and WORLD_SIZE per process from its --nnodes/--node-rank/--nproc-per-node arguments
(the Job passes the pod's completion index as the node rank, and MASTER_ADDR/MASTER_PORT for the rendezvous).
"""
import os

import torch
import torch.distributed as dist
import torchvision

dist.init_process_group("nccl")
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
model = torch.nn.parallel.DistributedDataParallel(torchvision.models.resnet50().cuda(), device_ids=[local_rank])
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
images, labels = torch.randn(64, 3, 224, 224).cuda(), torch.randint(0, 1000, (64,)).cuda()
for step in range(100 * int(os.environ.get("EPOCHS", "1"))):
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(images), labels)
    loss.backward()
    optimizer.step()
    if dist.get_rank() == 0 and step % 10 == 0:
        print(f"step {step} loss {loss.item():.3f} world {dist.get_world_size()}", flush=True)
dist.destroy_process_group()
