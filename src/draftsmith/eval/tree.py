"""Draft trees: their static shapes (`--tree`), the proposed tree itself, and its attention pattern.

A shape is a list of rank paths, Medusa's `medusa_choices` convention (ALGORITHMS.md section 2.4): path
`(i_1, ..., i_d)` is the node at depth d reached by taking the i_1-th ranked candidate at depth 1, then the
i_2-th ranked child of that node, and so on (0-based ranks). Shapes on the command line:

    chain       one path of `depth` top-1 candidates: [[0], [0, 0], ...]
    topk:K      K alternatives at every depth of the top-1 chain: [[0], .., [K-1], [0, 0], .., [0, K-1], ..]
                (K * depth draft tokens; the drafter's top-K candidates, deterministic)
    sample:K    the same shape, but the K alternatives are K independent samples from the drafter's
                distribution (LM drafters at temperature > 0; verified with the SpecInfer rule)
    paths:FILE  a JSON list of rank paths, e.g. a Medusa tree; must contain every prefix of every path
    dynamic:K:N EAGLE-2's dynamic tree (ALGORITHMS.md section 4): top-K expansion of the K best nodes per
                depth, then the N best of all candidates by cumulative draft log-probability (EAGLE drafters)
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch


@dataclass(frozen=True)
class TreeShape:
    """A static draft-tree shape.

    Attributes:
        paths: rank paths sorted by (depth, ranks); node i+1 of a proposed tree is paths[i] (0 = root).
        sampled: children are independent draws from the drafter's distribution instead of its top ranks;
            None (a chain not told either way) leaves it to the drafter: an LM drafter samples its chain at
            T > 0, a head drafts its top-ranked tokens (the evaluator's --draft-sample-method sets it).
        name: the spec it came from, for reports.
    """

    paths: tuple[tuple[int, ...], ...]
    sampled: bool | None = None
    name: str = "chain"
    dynamic_topk: int = 0  # > 0: an EAGLE-2 dynamic tree (no static paths)
    dynamic_tokens: int = 0  # its draft-token budget N
    dynamic_depth: int = 0

    @property
    def dynamic(self) -> bool:
        return self.dynamic_topk > 0

    @property
    def depth(self) -> int:
        if self.dynamic:
            return self.dynamic_depth
        return max((len(p) for p in self.paths), default=0)

    @property
    def num_draft(self) -> int:
        """Draft tokens per step at most."""
        return (
            min(self.dynamic_tokens, self.dynamic_topk * self.dynamic_depth)
            if self.dynamic
            else len(self.paths)
        )

    @property
    def is_chain(self) -> bool:
        return not self.dynamic and all(p == (0,) * len(p) for p in self.paths)

    def parents(self) -> list[int]:
        """Parent node index of every node (root = node 0 has parent -1)."""
        index = {p: i + 1 for i, p in enumerate(self.paths)}
        return [-1] + [index[p[:-1]] if len(p) > 1 else 0 for p in self.paths]

    def max_rank(self) -> int:
        """The largest rank used + 1 (how many candidates per node a drafter must rank)."""
        return 1 + max((r for p in self.paths for r in p), default=0)

    def truncated(self, depth: int) -> TreeShape:
        """The same shape without nodes deeper than `depth`."""
        return dataclasses.replace(
            self,
            paths=tuple(p for p in self.paths if len(p) <= depth),
            dynamic_depth=min(self.dynamic_depth, depth),
        )


def chain_shape(depth: int) -> TreeShape:
    return TreeShape(tuple((0,) * d for d in range(1, depth + 1)), None, "chain")


# Bounds on user numbers: engines draft at most a few dozen tokens per step; these keep a typo (--depth 100000)
# from growing a tree until the machine runs out of memory.
MAX_DEPTH = 64
MAX_TREE_NODES = 1024


def parse_tree(spec: str, depth: int) -> TreeShape:
    """Parse a `--tree` value (see the module docstring) for drafts of at most `depth` tokens.

    Raises:
        ValueError: an unknown spec, a bad K, or a paths file that is not a prefix-closed list of paths.
    """
    if not 0 <= depth <= MAX_DEPTH:
        raise ValueError(f"--depth must be in 0..{MAX_DEPTH} (draft tokens per step), got {depth}")
    shape = _parse(spec, depth)
    nodes = shape.dynamic_tokens if shape.dynamic_topk else len(shape.paths)
    if nodes > MAX_TREE_NODES or shape.dynamic_topk > MAX_TREE_NODES:
        raise ValueError(
            f"--tree {spec!r} at depth {depth} drafts {max(nodes, shape.dynamic_topk)} tokens per step; at most "
            f"{MAX_TREE_NODES} are verified in one target forward (lower K, N or --depth)"
        )
    return shape


def _parse(spec: str, depth: int) -> TreeShape:
    if spec == "chain":
        return chain_shape(depth)
    kind, _, arg = spec.partition(":")
    if kind in ("topk", "sample"):
        try:
            k = int(arg)
        except ValueError:
            k = 0
        if k < 1:
            raise ValueError(f"--tree {spec!r}: expected {kind}:K with an integer K >= 1, e.g. {kind}:3")
        paths = [(0,) * (d - 1) + (r,) for d in range(1, depth + 1) for r in range(k)]
        return TreeShape(_sorted(paths), kind == "sample", spec)
    if kind == "paths":
        return TreeShape(read_paths(Path(arg)), False, spec).truncated(depth)
    if kind == "dynamic":
        try:
            k, n = (int(x) for x in arg.split(":"))
        except ValueError:
            k = n = 0
        if k < 1 or n < 1:
            raise ValueError(
                f"--tree {spec!r}: expected dynamic:K:N with integers K, N >= 1, e.g. dynamic:4:16"
            )
        return TreeShape((), False, spec, dynamic_topk=k, dynamic_tokens=n, dynamic_depth=depth)
    raise ValueError(f"--tree {spec!r} is not known; use chain, topk:K, sample:K, paths:FILE or dynamic:K:N")


def read_paths(path: Path) -> tuple[tuple[int, ...], ...]:
    """Read and check a JSON list of rank paths (Medusa `medusa_choices` style)."""
    if not path.is_file():
        raise FileNotFoundError(
            f"tree file {path} does not exist (expected a JSON list of paths like [[0], [1]])"
        )
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"tree file {path} is not valid JSON: {e}") from e
    ok = isinstance(raw, list) and all(
        isinstance(p, list) and p and all(isinstance(r, int) and r >= 0 for r in p) for p in raw
    )
    if not ok:
        raise ValueError(
            f"tree file {path}: expected a JSON list of non-empty lists of ranks >= 0, like [[0], [0, 1]]"
        )
    paths = {tuple(p) for p in raw}
    missing = sorted({p[:i] for p in paths for i in range(1, len(p))} - paths)
    if missing:
        raise ValueError(
            f"tree file {path}: paths {[list(m) for m in missing[:5]]} are missing; every prefix of a "
            "path must be a node of the tree too"
        )
    return _sorted(paths)


def _sorted(paths: list[tuple[int, ...]] | set[tuple[int, ...]]) -> tuple[tuple[int, ...], ...]:
    return tuple(sorted(set(paths), key=lambda p: (len(p), p)))


@dataclass
class DraftTree:
    """A proposed draft: node 0 is the root (the last committed token, not yet seen by the target).

    Attributes:
        tokens: `[N]` token ids, parents before children.
        parents: parent index per node (-1 for the root).
        q: per node, the drafter distribution `[V]` its children were sampled from, or None when the children
            are deterministic (top-k ranks, n-gram matches): the verifier then uses the point-mass rule.
    """

    tokens: torch.Tensor
    parents: list[int]
    q: list[torch.Tensor | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.q:
            self.q = [None] * len(self.parents)
        if any(p >= i for i, p in enumerate(self.parents)) or self.parents[0] != -1:
            raise ValueError(f"tree parents {self.parents} must point to earlier nodes (root first)")

    def __len__(self) -> int:
        return len(self.parents)

    @property
    def num_draft(self) -> int:
        return len(self.parents) - 1

    def depths(self) -> list[int]:
        depth = [0] * len(self.parents)
        for i in range(1, len(self.parents)):
            depth[i] = depth[self.parents[i]] + 1
        return depth

    def children(self) -> list[list[int]]:
        kids: list[list[int]] = [[] for _ in self.parents]
        for i in range(1, len(self.parents)):
            kids[self.parents[i]].append(i)
        return kids

    def ancestor_mask(self) -> torch.Tensor:
        """`[N, N]` bool: `m[i, j]` iff node j is node i or one of its ancestors."""
        n = len(self.parents)
        mask = torch.eye(n, dtype=torch.bool)
        for i in range(1, n):
            mask[i] |= mask[self.parents[i]]
        return mask

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root to `node`, inclusive."""
        path = [node]
        while self.parents[path[-1]] >= 0:
            path.append(self.parents[path[-1]])
        return path[::-1]


def tree_attention(
    ancestors: torch.Tensor, past_len: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """The additive 4D mask `[1, 1, N, past_len + N]` for feeding tree nodes after `past_len` cached tokens.

    Every node sees the whole cached prefix and its own ancestors (and itself), nothing else. Additive
    (0 / dtype min) rather than boolean, so eager, sdpa and flex attention all read it the same way.
    """
    n = ancestors.shape[0]
    allowed = torch.cat([torch.ones(n, past_len, dtype=torch.bool), ancestors], dim=1).to(device)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


def layer_tree_masks(
    ancestors: torch.Tensor,
    query_positions: list[int],
    key_positions: list[int],
    past_len: int,
    config: object,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor | dict[str, torch.Tensor]:
    """`tree_attention` for any target: `ancestors [N, M]` says which of the M tree keys fed after `past_len`
    cached positions each of the N new nodes sees, at the given positions.

    A target whose layers attend differently gets one additive mask per layer type (transformers takes a
    `{layer_type: mask}` mapping for such models): sliding-window layers also hide keys `window` or more
    positions behind the query, chunked layers (Llama-4) keys of another chunk. A target with one layer type
    gets the plain mask."""
    types = set(getattr(config, "layer_types", None) or [])
    full = tree_attention(ancestors, past_len, dtype, device)
    if not types - {"full_attention", "linear_attention"}:
        return full
    query = torch.tensor(query_positions, device=device)
    keys = torch.cat([torch.arange(past_len, device=device), torch.tensor(key_positions, device=device)])
    masks = {"full_attention": full}
    window = getattr(config, "sliding_window", None)
    if "sliding_attention" in types and window:
        outside = (query[:, None] - keys[None, :]) >= int(window)
        masks["sliding_attention"] = full.masked_fill(outside[None, None], torch.finfo(dtype).min)
    chunk = getattr(config, "attention_chunk_size", None)
    if "chunked_attention" in types and chunk:
        other = (query[:, None] // int(chunk)) != (keys[None, :] // int(chunk))
        masks["chunked_attention"] = full.masked_fill(other[None, None], torch.finfo(dtype).min)
    missing = types - set(masks) - {"linear_attention"}
    if missing:
        raise ValueError(
            f"tree attention for layer types {sorted(missing)} is not supported; use --tree chain"
        )
    return masks
