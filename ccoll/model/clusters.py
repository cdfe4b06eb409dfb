"""Cluster descriptions from public specifications (``configs/clusters/*.yaml`` or a user's own file).

Why: a prediction is only as good as the link rates behind it, and a rate nobody can trace is a fudge
factor. Each shipped file cites its source per field; a user's file has the same fields and is checked
here once, with errors that name the file and the key.

Achieved vs nominal: the ``achieved_*`` fields say why a library's large-message bandwidth is below the link's --
each is a published measurement on that hardware, cited in the file beside it, never a value chosen to match a
result. The alpha-beta form of :mod:`ccoll.model.timing` (a latency per message plus bytes over the achieved rate)
then gives the message-size dependence of the efficiency.

Fields (bandwidths per direction):
    name, gpu                     strings
    gpus_per_node                 int >= 1
    hbm_gbytes_per_s              GPU memory bandwidth, GB/s (the codec roofline's numerator)
    peak_tflops                   {dtype: dense TFLOPS}; at least the training dtype
    intra.gbit_per_s_per_gpu      GPU-to-GPU link inside a node, Gbit/s per GPU
    intra.latency_us              per message
    inter.rail_gbit_per_s         one NIC port (rail), Gbit/s of data
    inter.rails_per_node          rails of a node, shared by its GPUs
    inter.mtu_bytes, header_bytes payload and header bytes per packet (payload efficiency); optional
    inter.latency_us              per message
    intra.achieved_fraction       optional, (0, 1]: the large-message rate an MPI/NCCL benchmark reached on this link,
                                  as a fraction of gbit_per_s_per_gpu, from a cited measurement (default 1)
    inter.achieved_gbit_per_s_per_rail  optional: a measured large-message data rate of one rail (replaces
                                  rail x payload efficiency; at most rail_gbit_per_s), from a cited benchmark
    inter.achieved_fraction       optional, (0, 1]: what the collective library reaches of that achievable rate,
                                  from a cited measurement (default 1)
    memory_gib                    GPU memory capacity, GiB; optional (``ccoll.model.memory``: does a layout fit)
    machine                       optional: which machine this is, in words (GPU, NICs per node and their rate, fabric)
    sources                       optional: {figure: citation}, figure = a key or ``intra.key`` / ``inter.key``; every
                                  shipped file cites every figure it gives (:func:`missing_sources`)

A file names one machine: ``h800-8x400g-ib`` is one H800 cluster with 8 x 400 Gbit/s NICs per node, not "an H800
node" (published H800 clusters have had fewer NICs per node). ``python -m ccoll.model --cluster-template FILE``
writes a commented file to fill in for yours (:data:`TEMPLATE`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import CcollError
from ..resources import config_path

#: where the shipped descriptions live (``--cluster lassen`` = this directory's lassen.yaml): configs/clusters/
#: as installed with the package (ccoll.resources)
CLUSTER_DIR = str(config_path("clusters"))


class ClusterError(CcollError):
    """A cluster description is missing a field or has a value of the wrong type or range."""


@dataclass(frozen=True)
class Node:
    """One node type of a cluster (see the module docstring for the fields)."""

    name: str
    gpu: str
    gpus_per_node: int
    hbm_gbytes_per_s: float
    peak_tflops: dict
    intra_gbps: float
    intra_latency_us: float
    rail_gbps: float
    rails_per_node: int
    inter_latency_us: float
    payload_efficiency: float = 1.0
    source: str = ""
    memory_gib: float | None = None
    #: measured fraction of ``intra_gbps`` a library reaches with large messages (see the module docstring)
    intra_achieved_fraction: float = 1.0
    #: measured large-message data Gbit/s of one rail (None: ``rail_gbps`` x ``payload_efficiency``)
    rail_achieved_gbps: float | None = None
    #: measured fraction of the rail's achievable rate the collective library reaches
    inter_achieved_fraction: float = 1.0
    #: which machine, in words (the file's ``machine``)
    machine: str = ""
    #: {figure: citation} (the file's ``sources``)
    sources: tuple = ()

    @property
    def intra_data_gbps(self) -> float:
        """Gbit/s one GPU moves to a peer inside the node with large messages: nominal x achieved fraction."""
        return self.intra_gbps * self.intra_achieved_fraction

    @property
    def rail_data_gbps(self) -> float:
        """Data Gbit/s of one rail with large messages: the measured rate where the file gives one, else the
        signalling rate x packet payload efficiency; times the library's measured fraction of it."""
        rate = self.rail_achieved_gbps if self.rail_achieved_gbps is not None else self.rail_gbps * self.payload_efficiency
        return rate * self.inter_achieved_fraction

    @property
    def node_gbps(self) -> float:
        """Data Gbit/s a node can send to other nodes: rails x one rail's data rate (:attr:`rail_data_gbps`)."""
        return self.rails_per_node * self.rail_data_gbps

    def scaled(self, fraction: float, intra: bool = True) -> "Node":
        """This node with its inter-node rates (rail, measured rail) and, if ``intra``, its intra-node rate times
        ``fraction``: for diagnostics that ask how slow the links would have to be, never for a prediction."""
        import dataclasses

        if not fraction > 0:
            raise ClusterError(f"cluster {self.name}: link rate fraction must be > 0, got {fraction!r}")
        ach = None if self.rail_achieved_gbps is None else self.rail_achieved_gbps * fraction
        return dataclasses.replace(self, intra_gbps=self.intra_gbps * (fraction if intra else 1.0),
                                   rail_gbps=self.rail_gbps * fraction, rail_achieved_gbps=ach)

    def gpu_share_gbps(self, active: int | None = None) -> float:
        """Inter-node Gbit/s per GPU when ``active`` GPUs of the node (default: all) send at once: the
        node's rails divided among them, at most the rails one GPU can reach (its own NIC on a rail-
        optimised node, all of them where the library stripes a message over rails, as MVAPICH2 and NCCL
        do; we take striping)."""
        a = self.gpus_per_node if active is None else max(1, min(active, self.gpus_per_node))
        return self.node_gbps / a

    def peak(self, dtype: str) -> float:
        try:
            return float(self.peak_tflops[dtype])
        except KeyError:
            raise ClusterError(f"cluster {self.name}: no peak_tflops for {dtype} (has {sorted(self.peak_tflops)})")


def _get(d: dict, key: str, kind, where: str, positive: bool = True):
    if not isinstance(d, dict) or key not in d:
        raise ClusterError(f"{where}: missing {key!r}")
    v = d[key]
    if kind is float and isinstance(v, int) and not isinstance(v, bool):
        v = float(v)
    if not isinstance(v, kind) or isinstance(v, bool):
        raise ClusterError(f"{where}: {key} must be {kind.__name__}, got {v!r}")
    if positive and kind in (int, float) and not v > 0:
        raise ClusterError(f"{where}: {key} must be > 0, got {v!r}")
    return v


def node_from_dict(d: dict, where: str = "cluster") -> Node:
    """Validate a parsed description (see the module docstring) into a :class:`Node`."""
    if not isinstance(d, dict):
        raise ClusterError(f"{where}: expected a mapping, got {type(d).__name__}")
    known = {"name", "gpu", "gpus_per_node", "hbm_gbytes_per_s", "peak_tflops", "intra", "inter", "memory_gib",
             "machine", "sources"}
    extra = sorted(set(d) - known)
    if extra:
        raise ClusterError(f"{where}: unknown keys {extra}; expected {sorted(known)}")
    peaks = d.get("peak_tflops")
    if not isinstance(peaks, dict) or not peaks:
        raise ClusterError(f"{where}: peak_tflops must be a mapping dtype -> TFLOPS")
    for k in list(peaks):
        _get(peaks, k, float, f"{where}: peak_tflops")
    intra, inter = d.get("intra"), d.get("inter")
    mtu = inter.get("mtu_bytes") if isinstance(inter, dict) else None
    eff = 1.0
    if mtu is not None:
        m = _get(inter, "mtu_bytes", int, f"{where}: inter")
        hdr = _get(inter, "header_bytes", int, f"{where}: inter", positive=False)
        eff = m / (m + hdr)
    for sec in ("intra", "inter"):
        if not isinstance(d.get(sec), dict):
            raise ClusterError(f"{where}: missing {sec!r} (a mapping; `python -m ccoll.model --cluster-template FILE` "
                               "writes a commented file to fill in)")
    sources = d.get("sources", {})
    if not isinstance(sources, dict) or not all(isinstance(v, str) for v in sources.values()):
        raise ClusterError(f"{where}: sources must map a figure (e.g. inter.rail_gbit_per_s) to a citation string")
    machine = d.get("machine", "")
    if not isinstance(machine, str):
        raise ClusterError(f"{where}: machine must be a string")
    intra_frac = _fraction(intra, f"{where}: intra")
    inter_frac = _fraction(inter, f"{where}: inter")
    rail = _get(inter, "rail_gbit_per_s", float, f"{where}: inter")
    achieved = None
    if isinstance(inter, dict) and "achieved_gbit_per_s_per_rail" in inter:
        achieved = _get(inter, "achieved_gbit_per_s_per_rail", float, f"{where}: inter")
        if achieved > rail:
            raise ClusterError(f"{where}: inter: achieved_gbit_per_s_per_rail {achieved:g} exceeds rail_gbit_per_s "
                               f"{rail:g} (a measured data rate cannot exceed the signalling rate)")
    return Node(name=_get(d, "name", str, where), gpu=_get(d, "gpu", str, where),
                gpus_per_node=_get(d, "gpus_per_node", int, where),
                hbm_gbytes_per_s=_get(d, "hbm_gbytes_per_s", float, where),
                peak_tflops={k: float(v) for k, v in peaks.items()},
                intra_gbps=_get(intra, "gbit_per_s_per_gpu", float, f"{where}: intra"),
                intra_latency_us=_get(intra, "latency_us", float, f"{where}: intra", positive=False),
                rail_gbps=rail,
                rails_per_node=_get(inter, "rails_per_node", int, f"{where}: inter"),
                inter_latency_us=_get(inter, "latency_us", float, f"{where}: inter", positive=False),
                payload_efficiency=eff, source=where,
                memory_gib=_get(d, "memory_gib", float, where) if "memory_gib" in d else None,
                intra_achieved_fraction=intra_frac, rail_achieved_gbps=achieved, inter_achieved_fraction=inter_frac,
                machine=machine, sources=tuple(sorted((str(k), v) for k, v in sources.items())))


#: the figures a file gives that need a citation: top-level keys and ``intra.`` / ``inter.`` ones
_CITED = ("gpus_per_node", "hbm_gbytes_per_s", "memory_gib", "peak_tflops")
_CITED_LINK = ("gbit_per_s_per_gpu", "latency_us", "achieved_fraction", "rail_gbit_per_s", "rails_per_node",
               "achieved_gbit_per_s_per_rail")


def missing_sources(d: dict) -> list[str]:
    """Figures of a parsed cluster file without a citation in its ``sources`` (shipped files have none missing)."""
    src = d.get("sources") or {}
    need = [k for k in _CITED if k in d]
    for sec in ("intra", "inter"):
        need += [f"{sec}.{k}" for k in _CITED_LINK if k in (d.get(sec) or {})]
    return [k for k in need if k not in src]


#: renamed shipped files: the old name is refused with the reason, never silently mapped to another machine
RENAMED = {"h800": "H800 clusters differ in NICs per node and their rate; the shipped one is "
                   "'h800-8x400g-ib' (8 x 400 Gbit/s, DeepSeek-V3's) -- use it only if that is your machine, else "
                   "write yours: python -m ccoll.model --cluster-template my-node.yaml"}

#: a commented cluster file to fill in (``--cluster-template FILE``)
TEMPLATE = """\
# A node of YOUR cluster for `python -m ccoll.model --cluster THIS_FILE`. Bandwidths are per direction.
# Fill every value from your hardware (nvidia-smi, ibstat / ibv_devinfo, the vendor's datasheet) and say where
# each came from under `sources:`. A measured large-message rate (nccl-tests all_reduce_perf busbw across two
# nodes, one GPU per NIC) goes in inter.achieved_gbit_per_s_per_rail.
name: my-node
machine: "N x GPU-MODEL per node, NVLink/PCIe, R x RATE Gbit/s InfiniBand/RoCE per node"   # which machine, in words
gpu: GPU-MODEL
gpus_per_node: 8                 # GPUs in one node
hbm_gbytes_per_s: 2039           # GPU memory bandwidth, GB/s (datasheet): the codec roofline
memory_gib: 80                   # GPU memory, GiB: layouts that cannot fit are refused
peak_tflops: {bfloat16: 312.0, float16: 312.0, float32: 19.5}   # dense peak per dtype (datasheet, no sparsity)
intra:
  gbit_per_s_per_gpu: 2400       # GPU-to-GPU inside the node, Gbit/s per GPU per direction (NVLink: 25 GB/s/link)
  latency_us: 1.0                # per message
  # achieved_fraction: 0.9       # optional, (0, 1]: measured large-message share of gbit_per_s_per_gpu
inter:
  rail_gbit_per_s: 200           # one NIC port, Gbit/s (ibstat "Rate")
  rails_per_node: 8              # NIC ports of the node used by the training fabric
  latency_us: 3.0                # per message across nodes
  mtu_bytes: 4096                # optional: InfiniBand MTU; with header_bytes, the payload efficiency
  header_bytes: 26
  # achieved_gbit_per_s_per_rail: 190   # optional: measured data rate of one rail (<= rail_gbit_per_s)
  # achieved_fraction: 0.95             # optional, (0, 1]: the library's share of that rate
sources:                         # figure -> where it came from
  gpus_per_node: "..."
  hbm_gbytes_per_s: "..."
  memory_gib: "..."
  peak_tflops: "..."
  intra.gbit_per_s_per_gpu: "..."
  inter.rail_gbit_per_s: "..."
  inter.rails_per_node: "..."
  intra.latency_us: "..."
  inter.latency_us: "..."
"""


def write_template(path: str) -> None:
    """Write :data:`TEMPLATE` to ``path`` (refusing to overwrite a file)."""
    if os.path.exists(path):
        raise ClusterError(f"{path}: exists; --cluster-template writes a new file only")
    with open(path, "w") as f:
        f.write(TEMPLATE)


def _fraction(d, where: str) -> float:
    """The optional ``achieved_fraction`` of a link section: a measured share in (0, 1], default 1."""
    if not isinstance(d, dict) or "achieved_fraction" not in d:
        return 1.0
    v = _get(d, "achieved_fraction", float, where)
    if v > 1:
        raise ClusterError(f"{where}: achieved_fraction must be in (0, 1], got {v!r}")
    return v


def load_cluster(name_or_path: str) -> Node:
    """A shipped cluster by name (``lassen``, ``dgx-a100``, ``dgx-h100``, ``h800-8x400g-ib``) or a YAML file."""
    import yaml

    path = name_or_path
    if not os.path.exists(path) and name_or_path in RENAMED:
        raise ClusterError(f"cluster {name_or_path!r}: {RENAMED[name_or_path]}")
    if not os.path.exists(path):
        path = os.path.join(CLUSTER_DIR, f"{name_or_path}.yaml")
    if not os.path.exists(path):
        raise ClusterError(f"cluster {name_or_path!r}: no such file; shipped: {', '.join(shipped_clusters())}")
    with open(path) as f:
        try:
            d = yaml.safe_load(f)
        except yaml.YAMLError as e:
            raise ClusterError(f"{path}: not YAML: {e}") from None
    try:
        return node_from_dict(d, path)
    except ClusterError as e:
        if "cluster-template" in str(e):
            raise
        raise ClusterError(f"{e} (`python -m ccoll.model --cluster-template FILE` writes a commented file with every "
                           "field)") from None


def with_rails(node: Node, rails: int | None = None, rail_gbps: float | None = None) -> Node:
    """``node`` with ``rails`` NICs per node and/or ``rail_gbps`` per NIC (the command line's ``--rails`` /
    ``--rail-gbps``): a given rate replaces the file's measured rate too (it was measured on the file's NICs)."""
    import dataclasses

    if rails is not None and rails < 1:
        raise ClusterError(f"--rails must be >= 1, got {rails}")
    if rail_gbps is not None and not rail_gbps > 0:
        raise ClusterError(f"--rail-gbps must be > 0, got {rail_gbps}")
    ch = {}
    if rails is not None:
        ch["rails_per_node"] = rails
    if rail_gbps is not None:
        ch.update(rail_gbps=rail_gbps, rail_achieved_gbps=None)
    return dataclasses.replace(node, **ch) if ch else node


def shipped_clusters() -> list[str]:
    return sorted(os.path.splitext(f)[0] for f in os.listdir(CLUSTER_DIR) if f.endswith(".yaml"))


def shaped_node(link_gbps: float, latency_us: float = 0.0, name: str = "shaped") -> Node:
    """The test bed of ``ccoll.bench.netem`` / ``ccoll.convergence.shaped`` as a cluster: every rank has its own
    network stack and one link of ``link_gbps`` each way to a switch (ccoll/bench/netem.py: tc tbf on both
    ends of each rank's veth), so a rank is a node of one GPU with one rail of that rate, and no group is
    inside a node. ``latency_us``: the link's netem delay, if the run set one (none by default: a constant
    per-call software cost is absorbed into the calibrated compute). Compute and codec rates come from the run
    (``predict(compute_s=..., codec_gbps=...)``), so the GPU fields are placeholders no prediction reads."""
    if not link_gbps > 0:
        raise ClusterError(f"shaped node: link rate must be > 0 Gbit/s, got {link_gbps!r}")
    return Node(name=name, gpu="rank", gpus_per_node=1, hbm_gbytes_per_s=1.0, peak_tflops={"float32": 1.0},
                intra_gbps=link_gbps, intra_latency_us=latency_us, rail_gbps=link_gbps, rails_per_node=1,
                inter_latency_us=latency_us, source=f"ccoll.bench.netem {link_gbps:g} Gbit/s per rank")
