"""Inference from a LightGBM text model without LightGBM: raw scores and SHAP contributions.

Analysis only needs two things from a trained booster: its raw score for a row (a sum of leaf values,
one leaf per tree) and the per-feature contributions behind it (TreeSHAP, what LightGBM's
`predict(pred_contrib=True)` returns). Importing LightGBM for that imported pandas and scipy too:
about 0.6 s of every `zoomer-ar analyze`, more than the analysis of a small trace. This module reads
the model file LightGBM writes (`Booster.save_model`: the format the project keeps its models in)
and evaluates it with numpy and plain Python. Training stays with LightGBM (learn/train.py).

What it evaluates: binary or regression boosters of numerical splits (`num_class=1`, one tree per
iteration, no categorical splits, no linear trees) - what learn/train.py writes. Anything else, and
any file it cannot read completely, raises `Unsupported`; the caller then loads the file with
LightGBM itself (learn/model.py), whose verdict and message stand. A tree that is damaged (`Corrupt`:
arrays of the wrong length, a split on a feature the model lacks, a child outside the tree or a cycle)
is refused outright: LightGBM aborts the process on the first three and hangs predicting the last.

Exactness (tests/learn/test_trees.py compares both on every shipped model and on random rows):
- a split sends a value left when `value <= threshold`, where the threshold is the file's decimal
  number read back to the same double; NaN goes the split's default way when its missing type is
  NaN, and is read as 0.0 otherwise; with missing type Zero, zero (|value| <= 1e-35, LightGBM's
  kZeroThreshold as a float) goes the default way. Values with |value| <= 1e-35 are 0.0 (LightGBM
  drops them when it reads a dense row).
- the raw score adds the trees' leaf values in file order from 0.0, as LightGBM does: the same
  double, bit for bit.
- contributions follow the TreeSHAP recursion (Lundberg et al. 2018, "Consistent individualized
  feature attribution for tree ensembles", Algorithm 2) with the trees' data counts as cover, plus
  each tree's expected value in the last slot; they agree with LightGBM's to rounding (~1e-12).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ZERO_THRESHOLD = float(np.float32(1e-35))  # LightGBM's kZeroThreshold (a float constant)
_DEFAULT_LEFT, _CATEGORICAL = 2, 1
_MISSING_NONE, _MISSING_ZERO, _MISSING_NAN = 0, 1, 2


class Unsupported(ValueError):
    """A model this evaluator does not read (or not completely): load it with LightGBM instead."""


class Corrupt(Unsupported):
    """A tree that breaks what every LightGBM model holds (its arrays as long as its num_leaves says, splits on
    the model's features, children inside the tree and below their node): a damaged file, never handed to
    LightGBM, which aborts the process on such a file or, on a cycle, loads it and never ends a prediction."""


@dataclass(frozen=True)
class Tree:
    """One tree, as plain lists (a row walks a tree in Python faster than numpy indexes it); the
    vectorised walk over many rows builds numpy arrays of them once (`arrays`)."""

    split_feature: list[int]  # per internal node
    threshold: list[float]
    default_left: list[bool]
    missing: list[int]  # 0 none, 1 zero, 2 NaN
    left: list[int]  # >= 0 internal node, < 0 leaf ~index
    right: list[int]
    leaf_value: list[float]
    leaf_count: list[float]  # data counts: the cover of TreeSHAP
    internal_count: list[float]

    @property
    def num_leaves(self) -> int:
        return len(self.leaf_value)

    def expected_value(self) -> float:
        if self.num_leaves == 1:
            return self.leaf_value[0]
        total = self.internal_count[0]
        out = 0.0
        for count, value in zip(self.leaf_count, self.leaf_value):
            out += (count / total) * value
        return out

    def go(self, node: int, value: float) -> int:
        """The child of internal `node` a feature value goes to."""
        missing = self.missing[node]
        if value != value and missing != _MISSING_NAN:  # NaN
            value = 0.0
        if (missing == _MISSING_ZERO and abs(value) <= ZERO_THRESHOLD) or (missing == _MISSING_NAN and value != value):
            return self.left[node] if self.default_left[node] else self.right[node]
        return self.left[node] if value <= self.threshold[node] else self.right[node]

    def leaf(self, x: list[float]) -> int:
        """The leaf index one row lands in."""
        node = 0 if self.num_leaves > 1 else -1
        while node >= 0:
            node = self.go(node, x[self.split_feature[node]])
        return ~node

    def arrays(self) -> dict[str, np.ndarray]:
        got = self.__dict__.get("_arrays")
        if got is None:
            got = {k: np.asarray(getattr(self, k)) for k in ("split_feature", "threshold", "default_left", "missing",
                                                              "left", "right", "leaf_value")}
            object.__setattr__(self, "_arrays", got)
        return got

    def leaves(self, X: np.ndarray) -> np.ndarray:
        """The leaf index each row of X lands in (vectorised over rows)."""
        n = X.shape[0]
        if self.num_leaves == 1:
            return np.zeros(n, dtype=np.int64)
        a = self.arrays()
        node = np.zeros(n, dtype=np.int64)
        active = np.arange(n)
        while active.size:
            nd = node[active]
            v = X[active, a["split_feature"][nd]]
            miss = a["missing"][nd]
            isnan = np.isnan(v)
            v = np.where(isnan & (miss != _MISSING_NAN), 0.0, v)
            to_default = ((miss == _MISSING_ZERO) & (np.abs(v) <= ZERO_THRESHOLD)) | ((miss == _MISSING_NAN) & isnan)
            go_left = np.where(to_default, a["default_left"][nd], v <= a["threshold"][nd])
            nxt = np.where(go_left, a["left"][nd], a["right"][nd])
            node[active] = nxt
            active = active[nxt >= 0]
        return ~node


class TextBooster:
    """A LightGBM text model, evaluated here (see the module docstring)."""

    def __init__(self, trees: list[Tree], num_features: int) -> None:
        self.trees = trees
        self.num_features = num_features

    @classmethod
    def from_text(cls, text: str) -> TextBooster:
        head, _, rest = text.partition("\nTree=")
        header = _fields(head.splitlines())
        if header.get("num_class", "1") != "1" or header.get("num_tree_per_iteration", "1") != "1":
            raise Unsupported("more than one tree per iteration")
        try:
            num_features = int(header["max_feature_idx"]) + 1
            sizes = header["tree_sizes"].split()
        except (KeyError, ValueError):
            raise Unsupported("no max_feature_idx or tree_sizes") from None
        if "end of trees" not in text or not rest:
            raise Unsupported("no trees")
        blocks = ("Tree=" + rest).split("end of trees", 1)[0].split("\nTree=")
        trees = [_tree(_fields(b.splitlines()[1:]), num_features) for b in blocks]
        if len(trees) != len(sizes):
            raise Unsupported(f"{len(trees)} trees read, tree_sizes lists {len(sizes)}")
        return cls(trees, num_features)

    def _rows(self, X) -> np.ndarray:
        X = np.array(X, dtype=np.float64, ndmin=2)  # a copy: small values are zeroed below
        if X.ndim != 2 or X.shape[1] != self.num_features:
            raise ValueError(f"expected rows of {self.num_features} features, got shape {X.shape}")
        X[np.abs(X) <= ZERO_THRESHOLD] = 0.0  # LightGBM leaves such values out of a dense row: 0.0
        return X

    def raw_score(self, X) -> np.ndarray:
        X = self._rows(X)
        if X.shape[0] <= 8:  # a few rows (analysis scores one): walk each tree in Python
            out = []
            for x in X.tolist():
                total = 0.0
                for t in self.trees:  # tree by tree, in file order: LightGBM's order of addition
                    total += t.leaf_value[t.leaf(x)]
                out.append(total)
            return np.asarray(out, dtype=np.float64)
        out = np.zeros(X.shape[0], dtype=np.float64)
        for t in self.trees:
            out += t.arrays()["leaf_value"][t.leaves(X)]
        return out

    def contributions(self, X) -> np.ndarray:
        """TreeSHAP contributions per row: num_features columns, then the expected value."""
        X = self._rows(X)
        out = np.zeros((X.shape[0], self.num_features + 1), dtype=np.float64)
        expected = [t.expected_value() for t in self.trees]  # the same for every row
        for r, x in enumerate(X.tolist()):
            phi = [0.0] * (self.num_features + 1)
            for t, ev in zip(self.trees, expected):
                phi[-1] += ev
                if t.num_leaves > 1:
                    _shap(t, x, phi, 0, [], 1.0, 1.0, -1)
            out[r] = phi
        return out

    def predict(self, X, raw_score: bool = False, pred_contrib: bool = False) -> np.ndarray:
        """The two calls of lightgbm.Booster.predict that inference makes."""
        if pred_contrib:
            return self.contributions(X)
        if raw_score:
            return self.raw_score(X)
        raise Unsupported("only raw scores and contributions are evaluated here")


def _fields(lines: list[str]) -> dict[str, str]:
    out = {}
    for line in lines:
        k, sep, v = line.partition("=")
        if sep:
            out[k.strip()] = v.strip()
    return out


def _tree(f: dict[str, str], num_features: int) -> Tree:
    try:
        n = int(f["num_leaves"])
        if f.get("num_cat", "0") != "0" or f.get("is_linear", "0") != "0":
            raise Unsupported("categorical splits or linear trees")
        leaf_value = [float(v) for v in f["leaf_value"].split()]
        if n == 1:
            return Tree([], [], [], [], [], [], leaf_value, [1.0], [])
        dt = [int(v) for v in f["decision_type"].split()]
        tree = Tree(
            split_feature=[int(v) for v in f["split_feature"].split()],
            threshold=[float(v) for v in f["threshold"].split()],
            default_left=[(d & _DEFAULT_LEFT) != 0 for d in dt],
            missing=[(d >> 2) & 3 for d in dt],
            left=[int(v) for v in f["left_child"].split()],
            right=[int(v) for v in f["right_child"].split()],
            leaf_value=leaf_value,
            leaf_count=[float(v) for v in f["leaf_count"].split()],
            internal_count=[float(v) for v in f["internal_count"].split()],
        )
    except (KeyError, ValueError) as exc:
        if isinstance(exc, Unsupported):
            raise
        raise Unsupported(f"unreadable tree ({exc})") from None
    if any(d & _CATEGORICAL for d in dt):
        raise Unsupported("categorical splits")
    sizes = {len(tree.split_feature), len(tree.threshold), len(tree.left), len(tree.right), len(tree.internal_count), n - 1}
    if len(sizes) != 1 or len(tree.leaf_value) != n or len(tree.leaf_count) != n:
        raise Corrupt("a tree's arrays disagree with its num_leaves")
    if any(v < 0 or v >= num_features for v in tree.split_feature):
        raise Corrupt("a split on a feature the model does not have")
    if any(k >= n - 1 or k < -n for k in (*tree.left, *tree.right)):
        raise Corrupt("a child outside the tree")
    # LightGBM numbers a split after its parent: a child's index above its node's is what makes every walk
    # end (a corrupt file with a cycle would otherwise walk for ever)
    if any(0 <= k <= i for i, pair in enumerate(zip(tree.left, tree.right)) for k in pair):
        raise Corrupt("a tree whose splits do not lead down to its leaves")
    return tree


# --- TreeSHAP (path-dependent): the unique path holds [feature, zero fraction, one fraction, weight]


def _extend(path: list[list], zero: float, one: float, feature: int) -> None:
    depth = len(path)
    path.append([feature, zero, one, 1.0 if depth == 0 else 0.0])
    for i in range(depth - 1, -1, -1):
        path[i + 1][3] += one * path[i][3] * (i + 1) / (depth + 1)
        path[i][3] = zero * path[i][3] * (depth - i) / (depth + 1)


def _unwind(path: list[list], k: int) -> None:
    depth = len(path) - 1
    _, zero, one, _ = path[k]
    nxt = path[depth][3]
    for i in range(depth - 1, -1, -1):
        if one != 0:
            tmp = path[i][3]
            path[i][3] = nxt * (depth + 1) / ((i + 1) * one)
            nxt = tmp - path[i][3] * zero * (depth - i) / (depth + 1)
        else:
            path[i][3] = (path[i][3] * (depth + 1)) / (zero * (depth - i))
    for i in range(k, depth):
        path[i][0], path[i][1], path[i][2] = path[i + 1][0], path[i + 1][1], path[i + 1][2]
    path.pop()


def _unwound_sum(path: list[list], k: int) -> float:
    depth = len(path) - 1
    _, zero, one, _ = path[k]
    nxt = path[depth][3]
    total = 0.0
    for i in range(depth - 1, -1, -1):
        if one != 0:
            tmp = nxt * (depth + 1) / ((i + 1) * one)
            total += tmp
            nxt = path[i][3] - tmp * zero * ((depth - i) / (depth + 1))
        elif zero != 0:
            total += (path[i][3] / zero) / ((depth - i) / (depth + 1))
    return total


def _cover(t: Tree, node: int) -> float:
    return t.internal_count[node] if node >= 0 else t.leaf_count[~node]


def _shap(t: Tree, x: list[float], phi: list[float], node: int, parent: list[list],
          zero: float, one: float, feature: int) -> None:
    path = [list(e) for e in parent]
    _extend(path, zero, one, feature)
    if node < 0:
        value = t.leaf_value[~node]
        for i in range(1, len(path)):
            w = _unwound_sum(path, i)
            phi[path[i][0]] += w * (path[i][2] - path[i][1]) * value
        return
    split = t.split_feature[node]
    hot = t.go(node, x[split])
    cold = t.right[node] if hot == t.left[node] else t.left[node]
    w = _cover(t, node)
    hot_zero, cold_zero = _cover(t, hot) / w, _cover(t, cold) / w
    in_zero = in_one = 1.0
    k = next((i for i, e in enumerate(path) if e[0] == split), None)
    if k is not None:  # the feature split before on this path: undo that split, redo it here
        in_zero, in_one = path[k][1], path[k][2]
        _unwind(path, k)
    _shap(t, x, phi, hot, path, hot_zero * in_zero, in_one, split)
    _shap(t, x, phi, cold, path, cold_zero * in_zero, 0.0, split)
