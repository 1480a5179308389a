"""Auxiliary reconstruction loss: the core's output must describe past observations.

RL gives a memory no reason to keep a cue before the choice it decides is learnt (the value,
the entropy and the policy at the cue and delay steps do not depend on it), so the state is
reshaped around what they reward and the cue is lost (docs/memory_match.md). Hung et al.'s
RMA and TVT agents (arXiv:1810.06721) and Wayne et al.'s MERLIN (arXiv:1803.10760) train their
memory with reconstruction losses for this reason. This head asks the actor's core output at
step ``t`` to reconstruct the observation of step ``t - lag`` for each lag in ``lags``
(``0`` = the current view, as in RMA; larger lags ask the state to keep what it saw, with no
label beyond the agent's own past observations).

- MiniGrid images: the object kind (11 classes) and colour (6) of every view cell by
  cross-entropy, summed over the cells (the observation's negative log-likelihood; a mean
  over cells would weigh the one cell that holds a cue 1/49 of the walls and floor). The
  door state channel is left out. ``objects_only`` scores only the cells that hold a thing
  (door, key, ball, box, goal, lava), so the state is asked to keep what it saw, not the
  room's wall layout, which a 64-unit memory cannot hold for many steps anyway.
- Vector observations (POPGym): mean squared error on the vector.

Targets exist only where ``t - lag`` lies in the same chunk and the same episode.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from minigrid.core.constants import OBJECT_TO_IDX
from torch import Tensor, nn
from torch.nn import functional as F

from memcores.envs.observation import CELL_VOCAB

_N_OBJECTS, _N_COLORS, _ = CELL_VOCAB
# Object ids below the door's are background: unseen, empty, wall, floor.
_FIRST_THING = OBJECT_TO_IDX["door"]


def source_mask(starts: Tensor, lags: Sequence[int]) -> Tensor:
    """``[L, M, n_lags]`` bool: the view of step ``s`` is read back by step ``s + lags[j]``,
    which lies in the same chunk and the same episode.

    :param starts: ``[L, M]`` bool, true on the first step of an episode.
    """
    length = starts.shape[0]
    lag = torch.tensor(list(lags), dtype=torch.long, device=starts.device)
    episodes = starts.long().cumsum(0)  # [L, M]: episode index within the chunk
    reader = torch.arange(length, device=starts.device)[:, None] + lag  # [L, n_lags]
    # no episode start in (s, s + lag]  <=>  same count of starts at s and s + lag
    same = episodes[reader.clamp(max=length - 1)] == episodes[:, None, :]  # [L, n_lags, M]
    return (same & (reader < length)[..., None]).transpose(1, 2)


def lag_mask(starts: Tensor, lag: int) -> Tensor:
    """``[L, M]`` bool: step ``t`` has a target ``lag`` steps back in the same episode (the
    reader's view of :func:`source_mask`).

    :param starts: ``[L, M]`` bool, true on the first step of an episode.
    """
    length = starts.shape[0]
    mask = torch.zeros_like(starts, dtype=torch.bool)
    if lag < length:
        mask[lag:] = source_mask(starts, [lag])[: length - lag, :, 0]
    return mask


class ObservationDecoder(nn.Module):
    """One linear read-out per lag from the core output to the observation ``lag`` steps back.

    :param hidden_size: the actor core's output size ``H``.
    :param obs_shape: ``(H_view, W_view, 3)`` for MiniGrid images or ``(n,)`` for vectors.
    :param lags: non-negative steps back, e.g. ``(0,)`` or ``(0, 2, 8, 32)``.
    :param objects_only: images: score only the cells that hold a thing (not background).
    """

    def __init__(
        self,
        hidden_size: int,
        obs_shape: tuple[int, ...],
        lags: Sequence[int],
        objects_only: bool = False,
    ) -> None:
        super().__init__()
        self.objects_only = objects_only
        if not lags or any(int(k) < 0 for k in lags):
            raise ValueError(f"reconstruction lags must be a non-empty list of ints >= 0: {lags}")
        self.lags = tuple(int(k) for k in lags)
        self.image = len(obs_shape) == 3
        self.cells = obs_shape[0] * obs_shape[1] if self.image else 0
        out = self.cells * (_N_OBJECTS + _N_COLORS) if self.image else obs_shape[0]
        self.heads = nn.ModuleList(nn.Linear(hidden_size, out) for _ in self.lags)

    def loss(self, features: Tensor, obs: dict[str, Tensor], starts: Tensor) -> Tensor:
        """Mean reconstruction loss over lags (each lag's loss averaged over its valid steps).

        :param features: ``[L, M, H]`` the actor core's outputs over whole chunks.
        :param obs: the chunks' observations, each ``[L, M, ...]``.
        :param starts: ``[L, M]`` bool episode starts.
        """
        if self.image:
            return self._image_loss(features, obs["image"], starts)
        terms = []
        length = starts.shape[0]
        for lag, head in zip(self.lags, self.heads, strict=True):
            valid = lag_mask(starts, lag)  # [L, M]
            if not bool(valid.any()):
                continue
            feats = features[lag:][valid[lag:]]  # [V, H]
            target = obs["vector"][: length - lag][valid[lag:]]  # [V, n]
            terms.append(F.mse_loss(head(feats), target))
        if not terms:
            return features.sum() * 0.0
        return torch.stack(terms).mean()

    def _image_loss(self, features: Tensor, image: Tensor, starts: Tensor) -> Tensor:
        """Summed per-cell cross-entropy per observation, averaged over each lag's valid steps,
        then over the lags that have any.

        :param features: ``[L, M, H]`` core outputs; :param image: ``[L, M, h, w, 3]`` views.
        """
        length, n_cols = starts.shape
        lags = torch.tensor(self.lags, device=starts.device)
        valid = source_mask(starts, self.lags)  # [L, M, n_lags]
        counts = valid.sum((0, 1))  # [n_lags] steps scored per lag
        used = counts > 0
        lag_weight = used / (counts.clamp(min=1) * used.sum().clamp(min=1))  # [n_lags]

        cells = image.flatten(2, 3).long()  # [L, M, cells, 3]
        objects = cells[..., 0].clamp(max=_N_OBJECTS - 1)
        colors = cells[..., 1].clamp(max=_N_COLORS - 1)
        if self.objects_only:
            scored = objects >= _FIRST_THING
        else:
            scored = torch.ones_like(objects, dtype=torch.bool)
        step, env, cell = scored.nonzero(as_tuple=True)  # [K0] scored cells
        item, lag = valid[step, env].nonzero(as_tuple=True)  # [K] (scored cell, lag) pairs
        step, env, cell = step[item], env[item], cell[item]
        rows = (step + lags[lag]) * n_cols + env  # [K] the reader's row in [L * M]
        logits = self._read_out(
            features.reshape(length * n_cols, -1), rows, lag * self.cells + cell
        )
        nll = F.cross_entropy(logits[:, :_N_OBJECTS], objects[step, env, cell], reduction="none")
        nll = nll + F.cross_entropy(
            logits[:, _N_OBJECTS:], colors[step, env, cell], reduction="none"
        )
        return (nll * lag_weight[lag]).sum()

    def _read_out(self, features: Tensor, rows: Tensor, groups: Tensor) -> Tensor:
        """``[K, C]`` logits: item ``k`` reads ``features[rows[k]]`` through the ``[C, H]``
        weight block of head cell ``groups[k]`` (``lag index * cells + cell``).

        Items are padded into one column block per group and read out by one batched matmul
        against the heads' weights in place: nothing of size ``K x C x H`` is gathered and the
        weight gradient needs no scatter. At a few things per view this is ~6x cheaper (forward
        and backward) than a per-lag loop of gathered weights and ~2.5x cheaper than decoding
        every cell at every lag and picking; with every cell scored it costs about the latter.

        :param features: ``[R, H]``; :param rows: ``[K]`` into ``R``; :param groups: ``[K]``.
        """
        classes = _N_OBJECTS + _N_COLORS
        n_groups = len(self.lags) * self.cells
        weight = torch.cat([head.weight for head in self.heads]).view(n_groups, classes, -1)
        bias = torch.cat([head.bias for head in self.heads]).view(n_groups, classes, 1)
        groups, order = torch.sort(groups, stable=True)
        sizes = torch.bincount(groups, minlength=n_groups)  # [G]
        rank = torch.arange(len(groups), device=groups.device) - (sizes.cumsum(0) - sizes)[groups]
        width = max(int(sizes.max()), 1)
        slot = groups * width + rank  # [K] each sorted item's column in its group's block
        padded = features.new_zeros(n_groups * width, features.shape[-1])
        padded = padded.index_copy(0, slot, features.index_select(0, rows[order]))
        logits = torch.baddbmm(bias, weight, padded.view(n_groups, width, -1).transpose(1, 2))
        picked = logits.transpose(1, 2).reshape(n_groups * width, classes).index_select(0, slot)
        return picked.index_select(0, torch.argsort(order))  # back to the items' order
