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

from envs.observation import CELL_VOCAB

_N_OBJECTS, _N_COLORS, _ = CELL_VOCAB
# Object ids below the door's are background: unseen, empty, wall, floor.
_FIRST_THING = OBJECT_TO_IDX["door"]


def lag_mask(starts: Tensor, lag: int) -> Tensor:
    """``[L, M]`` bool: step ``t`` has a target ``lag`` steps back in the same episode.

    :param starts: ``[L, M]`` bool, true on the first step of an episode.
    """
    length = starts.shape[0]
    mask = torch.zeros_like(starts, dtype=torch.bool)
    if lag >= length:
        return mask
    episodes = starts.long().cumsum(0)  # [L, M]: episode index within the chunk
    # no episode start in (t - lag, t]  <=>  same count of starts at t and t - lag
    mask[lag:] = episodes[lag:] == episodes[: length - lag]
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
        """Mean reconstruction loss over lags and valid steps (a scalar).

        :param features: ``[L, M, H]`` the actor core's outputs over whole chunks.
        :param obs: the chunks' observations, each ``[L, M, ...]``.
        :param starts: ``[L, M]`` bool episode starts.
        """
        terms = []
        for lag, head in zip(self.lags, self.heads, strict=True):
            valid = lag_mask(starts, lag)  # [L, M]
            if not bool(valid.any()):
                continue
            length = starts.shape[0]
            feats = features[lag:][valid[lag:]]  # [V, H]
            if self.image:
                target = obs["image"][: length - lag][valid[lag:]].long()  # [V, h, w, 3]
                target = target.flatten(1, 2)  # [V, cells, 3]
                term = self._image_term(head, feats, target)
            else:
                target = obs["vector"][: length - lag][valid[lag:]]  # [V, n]
                term = F.mse_loss(head(feats), target)
            terms.append(term)
        if not terms:
            return features.sum() * 0.0
        return torch.stack(terms).mean()

    def _image_term(self, head: nn.Linear, feats: Tensor, target: Tensor) -> Tensor:
        """Summed per-cell cross-entropy, averaged over observations.

        :param feats: ``[V, H]`` core outputs; :param target: ``[V, cells, 3]`` their views.
        """
        classes = _N_OBJECTS + _N_COLORS
        objects = target[..., 0].clamp(max=_N_OBJECTS - 1)  # [V, cells]
        colors = target[..., 1].clamp(max=_N_COLORS - 1)
        if self.objects_only:
            # Read out only the cells that hold a thing (a few per view): gathering their rows
            # of the head is ~50x cheaper than decoding all cells and masking.
            obs_idx, cell_idx = (objects >= _FIRST_THING).nonzero(as_tuple=True)  # [K]
            weight = head.weight.view(self.cells, classes, -1)[cell_idx]  # [K, C, H]
            bias = head.bias.view(self.cells, classes)[cell_idx]  # [K, C]
            logits = torch.einsum("kch,kh->kc", weight, feats[obs_idx]) + bias  # [K, C]
            objects, colors = objects[obs_idx, cell_idx], colors[obs_idx, cell_idx]  # [K]
        else:
            logits = head(feats).view(-1, classes)  # [V * cells, C]
            objects, colors = objects.flatten(), colors.flatten()
        total = F.cross_entropy(logits[:, :_N_OBJECTS], objects, reduction="sum")
        total = total + F.cross_entropy(logits[:, _N_OBJECTS:], colors, reduction="sum")
        return total / target.shape[0]
