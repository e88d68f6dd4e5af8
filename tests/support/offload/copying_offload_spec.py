"""A test-owned OffloadingSpec for vLLM's OffloadingConnector on the CPU build: vLLM's own
CPUOffloadingSpec (its config, manager and scheduler side) with a worker that copies the KV cache's
blocks to and from CPU tensors synchronously (vLLM's CPUOffloadingWorker needs CUDA or XPU). Each
job's result carries the bytes it copied and its wall time, as vLLM's worker reports device time."""

from time import perf_counter

import torch
from vllm.v1.kv_offload.base import OffloadingWorker, TransferResult
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec


class CopyingWorker(OffloadingWorker):
    def __init__(self, kv_caches, blocks_per_chunk: int, num_chunks: int) -> None:
        self.device = [t.tensor for t in kv_caches.tensors]  # (num_blocks, page bytes), int8
        rows = max(num_chunks, 1) * blocks_per_chunk
        self.host = [torch.zeros((rows, t.shape[1]), dtype=t.dtype) for t in self.device]
        self.blocks_per_chunk = blocks_per_chunk
        self.done: list = []

    def _rows(self, gpu_spec, cpu_spec) -> tuple[list, list]:
        gpu = [int(b) for b in gpu_spec.block_ids]
        first = int(gpu_spec.block_indices[0]) % self.blocks_per_chunk if len(gpu_spec.block_indices) else 0
        chunks = [int(c) for c in cpu_spec.block_ids]
        host = [
            chunks[(first + i) // self.blocks_per_chunk] * self.blocks_per_chunk + (first + i) % self.blocks_per_chunk
            for i in range(len(gpu))
        ]
        return gpu, host

    def _copy(self, job_id: int, gpu_spec, cpu_spec, store: bool) -> bool:
        start = perf_counter()
        gpu, host = self._rows(gpu_spec, cpu_spec)
        size = 0
        for device, pinned in zip(self.device, self.host):
            g, h = torch.tensor(gpu, dtype=torch.long), torch.tensor(host, dtype=torch.long)
            if store:
                pinned[h] = device[g]
            else:
                device[g] = pinned[h]
            size += len(gpu) * device.shape[1]
        self.done.append(TransferResult(job_id, True, size, perf_counter() - start))
        return True

    def submit_store(self, job_id, src_spec, dst_spec) -> bool:
        return self._copy(job_id, src_spec, dst_spec, store=True)

    def submit_load(self, job_id, src_spec, dst_spec, expedited: bool = False) -> bool:
        return self._copy(job_id, dst_spec, src_spec, store=False)

    def get_finished(self) -> list:
        done, self.done = self.done, []
        return done

    def wait(self, job_ids) -> None:
        pass


class CopyingCPUOffloadingSpec(CPUOffloadingSpec):
    def get_worker(self, kv_caches):
        if self._worker is None:
            self._worker = CopyingWorker(kv_caches, self.blocks_per_chunk, self.num_chunks)
        return self._worker
