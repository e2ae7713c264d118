"""The host side of ``offload_optimizer``, per rank: DeepSpeedCPUAdam's rate and the fp32 -> 16-bit conversion DeepSpeed
makes on the CPU after it (ZeRO-Offload, Ren et al., arXiv 2101.06840, Sec. 4.2: the step runs on the CPU, one
process per GPU, all of a node's ranks at once).

Measured on CPU ranks here (benchmarks/measure_cpu_adam_ranks.py, zeroplanner/_measurements/cpu_adam_ranks.json,
docs/validation.md section 5): the rate is per thread, whether the threads share one rank or sit in two ranks, so
a rank's rate is its OpenMP threads times one thread's, up to what one process reaches on a whole GPU host; when
the ranks' threads outnumber the cores (the deepspeed launcher without ``--bind_cores_to_rank`` gives every rank
all of them) each rank gets its share of the cores, and measured no worse than that.
"""

from __future__ import annotations

from ..specs import ClusterSpec

CPU_ADAM_PARAMS_PER_SECOND_PER_THREAD = 7.58e8
"""DeepSpeedCPUAdam parameter updates per second on one OpenMP thread: 100,000,000 parameters in a median 0.132 s on
one core of the 2-core build machine (AMD EPYC, DeepSpeed 0.19.8; _measurements/cpu_adam_ranks.json row 1 thread x 1
rank, 2026-12-03). Two threads in one rank and one thread in each of two ranks measured 1.48e9 and 1.54e9 per
node: the rate scales with threads."""

CPU_ADAM_PARAMS_PER_SECOND_PER_PROCESS = 1.41e9
"""The most one process reached on a GPU host: DeepSpeed PR #735 (2021-02-08) "reduces the optimizer time from 56
seconds to 8.2 seconds [for] an 11.6B parameter GPT2 model" (11.6e9 / 8.2 s), one process with the host's cores;
the ZeRO-Offload tutorial's 10B GPT-2 log (optimizer 7,613 ms, 1.31e9/s, THROUGHPUT.md row 4) agrees. Past a few
threads the update is bound by host memory traffic, not by cores (the step reads and writes the fp32 master,
both moments and the gradient)."""

HOST_CONVERSION_PER_SECOND_PER_THREAD = 2.61e9
"""fp32 -> bf16 elements per second one torch thread converts on the host: 100,000,000 elements, median of 7
(benchmarks/measure_host_conversion.py, zeroplanner/_measurements/host_conversion.json, 2026-12-04, 1 thread of
the 2-core build machine at load average 2.1: a floor). DeepSpeed makes this pass on the CPU after every offloaded
optimizer step (stage_1_and_2.py ``bit16_partition_buffer.data.copy_(fp32_partition.data)``; stage3.py's blocking
``fp16_partitioned_groups_flat`` copy, which ATen converts on the CPU side: aten/src/ATen/native/cuda/Copy.cu, "For
blocking transfers conversions are performed on CPU")."""

OVERSUBSCRIBED_NODE_RATES = ((1, 1.68e9), (2, 2.28e9), (4, 2.69e9), (8, 2.97e9), (16, 2.62e9))
"""(threads per core, node params/s): 2 ranks of DeepSpeedCPUAdam stepping together on the 2 cores with 1, 2, 4, 8 and
16 threads each (benchmarks/measure_cpu_adam_ranks.py --configs 1x2,2x2,4x2,8x2,16x2, 100,000,000 parameters per
rank, _measurements/cpu_adam_oversubscribed.json, 2026-12-04, load average 0.6-1.4). More threads than cores did
not slow the node down (it ran up to 1.8x faster: more memory streams in flight), and a plain PyTorch AdamW
with 8 one-thread ranks on 2 cores shared the node in proportion (ISEEKYAN/Megatron-LM #188: 8 x 536.9M
parameters in 17.2 s vs 536.9M in 1.81 s on one rank, docs/offload_sources.md C). So the model gives an
oversubscribed rank its share of the cores and no penalty; the speed-up is not counted (measured on 2 cores only)."""


def oversubscription(cluster: ClusterSpec) -> float:
    """Threads per core of a node's CPU-Adam (cpu_adam_threads_per_rank x gpus_per_node / host_cpu_cores_per_node),
    1.0 when no more than the cores or the cores are not given."""
    cores = cluster.host_cpu_cores_per_node
    if cores is None:
        return 1.0
    return max(1.0, cluster.cpu_adam_threads_per_rank * cluster.gpus_per_node / cores)


def _threads_used(cluster: ClusterSpec) -> float:
    """Cores' worth of threads one rank gets: its threads, or its share of the cores when they are oversubscribed."""
    o = oversubscription(cluster)
    return cluster.cpu_adam_threads_per_rank / o


def cpu_adam_params_per_second_per_rank(cluster: ClusterSpec) -> float:
    """Parameter updates per second of one rank's DeepSpeedCPUAdam (float).

    ``cluster.cpu_adam_params_per_second`` (a measured node rate) shared by the node's ``gpus_per_node`` ranks when
    set; otherwise ``min(threads x CPU_ADAM_PARAMS_PER_SECOND_PER_THREAD, CPU_ADAM_PARAMS_PER_SECOND_PER_PROCESS)``
    with the rank's ``cpu_adam_threads_per_rank`` threads (launcher defaults: see that field), or its share of
    ``host_cpu_cores_per_node`` when the node's threads outnumber its cores (OVERSUBSCRIBED_NODE_RATES)."""
    if cluster.cpu_adam_params_per_second is not None:
        return cluster.cpu_adam_params_per_second / cluster.gpus_per_node
    return min(_threads_used(cluster) * CPU_ADAM_PARAMS_PER_SECOND_PER_THREAD, CPU_ADAM_PARAMS_PER_SECOND_PER_PROCESS)


ADAM_HOST_BYTES_PER_PARAMETER = 28
"""Host memory bytes one DeepSpeedCPUAdam update moves: it reads and writes the fp32 master, exp_avg and exp_avg_sq
(3 x 8) and reads the fp32 gradient (4) (csrc/adam/cpu_adam_impl.cpp Step_AVX)."""

CONVERSION_HOST_BYTES_PER_ELEMENT = 6
"""Host memory bytes one fp32 -> 16-bit conversion moves: 4 read, 2 written."""

HOST_CONVERSION_PER_SECOND_PER_PROCESS = (CPU_ADAM_PARAMS_PER_SECOND_PER_PROCESS * ADAM_HOST_BYTES_PER_PARAMETER
                                          / CONVERSION_HOST_BYTES_PER_ELEMENT)
"""The most one process converts: the host memory traffic one process reached in CPU-Adam (PR #735's 1.41e9/s x 28
bytes, 39.5 GB/s) at the conversion's 6 bytes per element. The conversion's scaling with threads is not measured
here beyond 1 thread (2 threads ran 0.81x one at load average 2.1, host_conversion.json); the model scales it
with threads up to this bound, as CPU-Adam's."""


def host_conversion_per_second_per_rank(cluster: ClusterSpec) -> float:
    """fp32 -> 16-bit elements per second one rank converts on the host: its threads (torch's intra-op threads follow
    OMP_NUM_THREADS too; its share of the cores when oversubscribed) x HOST_CONVERSION_PER_SECOND_PER_THREAD, up to
    HOST_CONVERSION_PER_SECOND_PER_PROCESS."""
    return min(_threads_used(cluster) * HOST_CONVERSION_PER_SECOND_PER_THREAD, HOST_CONVERSION_PER_SECOND_PER_PROCESS)

