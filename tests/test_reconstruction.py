"""The auxiliary reconstruction loss (agents/reconstruction.py, agent.recon_coef/recon_lags)."""

from __future__ import annotations

import pytest
import torch
from rl_helpers import tiny_config

from memcores.agents.episodes import EpisodeStats
from memcores.agents.ppo import update
from memcores.agents.reconstruction import ObservationDecoder, lag_mask
from memcores.agents.rl_trainer import setup
from memcores.agents.rollout import RolloutBuffer, collect_rollout, obs_shapes, start_rollouts
from memcores.experiments.config import ConfigError


def test_lag_mask_stays_inside_episode_and_chunk():
    starts = torch.tensor([[1, 0], [0, 0], [1, 0], [0, 1], [0, 0]], dtype=torch.bool)  # [L=5, M=2]
    assert lag_mask(starts, 0).all()
    expected_lag1 = torch.tensor([[0, 0], [1, 1], [0, 1], [1, 0], [1, 1]], dtype=torch.bool)
    torch.testing.assert_close(lag_mask(starts, 1), expected_lag1)
    # lag 2: column 0 has an episode start at t=2, so t=2 and t=3 look back into episode one
    expected_lag2 = torch.tensor([[0, 0], [0, 0], [0, 1], [0, 0], [1, 0]], dtype=torch.bool)
    torch.testing.assert_close(lag_mask(starts, 2), expected_lag2)
    assert not lag_mask(starts, 5).any()


def _identity_decoder(n: int, lag: int) -> ObservationDecoder:
    decoder = ObservationDecoder(n, (n,), [lag])
    with torch.no_grad():
        decoder.heads[0].weight.copy_(torch.eye(n))
        decoder.heads[0].bias.zero_()
    return decoder


def test_vector_targets_are_the_observations_lag_steps_back():
    """Features that ARE the observation ``lag`` steps back reconstruct it exactly, whatever
    they hold across an episode boundary; the current observation does not."""
    L, M, n, lag = 6, 3, 4, 2
    obs = torch.randn(L, M, n)
    starts = torch.zeros(L, M, dtype=torch.bool)
    starts[3, 1] = True
    features = torch.randn(L, M, n) * 10  # garbage where no target exists
    valid = lag_mask(starts, lag)
    features[lag:][valid[lag:]] = obs[: L - lag][valid[lag:]]
    decoder = _identity_decoder(n, lag)
    with torch.no_grad():
        exact = float(decoder.loss(features, {"vector": obs}, starts))
        current = float(decoder.loss(obs, {"vector": obs}, starts))
    assert exact == pytest.approx(0.0, abs=1e-10)
    assert current > 0.1


def test_image_loss_learns_objects_and_colours():
    """The image head's loss falls when trained, and reaches the features it reads."""
    torch.manual_seed(0)
    L, M, H = 5, 4, 32
    image = torch.zeros(L, M, 7, 7, 3, dtype=torch.uint8)
    image[..., 0] = torch.randint(0, 11, (L, M, 7, 7))
    image[..., 1] = torch.randint(0, 6, (L, M, 7, 7))
    features = torch.randn(L, M, H, requires_grad=True)
    decoder = ObservationDecoder(H, (7, 7, 3), [0, 1])
    starts = torch.zeros(L, M, dtype=torch.bool)
    first = decoder.loss(features, {"image": image}, starts)
    first.backward()
    assert features.grad is not None and float(features.grad.abs().sum()) > 0
    optimiser = torch.optim.Adam([*decoder.parameters(), features], lr=0.05)
    for _ in range(200):
        optimiser.zero_grad()
        loss = decoder.loss(features, {"image": image}, starts)
        loss.backward()
        optimiser.step()
    assert loss.item() < 0.5 * first.item()


def test_update_trains_the_decoder_with_the_policy():
    """With agent.recon_coef > 0 the policy owns a decoder, the update reports its loss and
    moves its weights; with the default 0 there is no decoder."""
    assert setup(tiny_config()).policy.decoder is None
    config = tiny_config("agent.recon_coef=1.0", "agent.recon_lags=[0,3]")
    s = setup(config)
    assert s.policy.decoder is not None and s.policy.decoder.lags == (0, 3)
    N = config.env.n_envs
    buffer = RolloutBuffer(
        obs_shapes(s.envs.single_observation_space),
        config.agent.n_steps,
        N,
        config.agent.seq_len,
        s.policy.initial_state(N, s.device),
        s.device,
    )
    carry = start_rollouts(s.policy, s.envs, 0, s.device)
    collect_rollout(s.policy, s.envs, buffer, carry, EpisodeStats(N))
    s.envs.close()
    before = [p.detach().clone() for p in s.policy.decoder.parameters()]
    stats = update(s.policy, s.optimizer, buffer, config.agent)
    assert stats.recon_loss > 0
    after = list(s.policy.decoder.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))


@pytest.mark.parametrize(
    "override, message",
    [
        ("agent.recon_coef=-1", "recon_coef"),
        ("agent.recon_lags=[8]", "recon_lags"),  # seq_len is 8
        ("agent.recon_lags=[]", "recon_lags"),
    ],
)
def test_bad_reconstruction_options_are_refused(override, message):
    with pytest.raises((ConfigError, ValueError), match=message):
        tiny_config(override)


def test_objects_only_ignores_walls_and_floor():
    """recon_target=objects: two views that differ only in their background score the same;
    a different ball colour does not."""
    torch.manual_seed(0)
    decoder = ObservationDecoder(8, (7, 7, 3), [0], objects_only=True)
    features = torch.randn(1, 1, 8)
    starts = torch.zeros(1, 1, dtype=torch.bool)
    view = torch.zeros(1, 1, 7, 7, 3, dtype=torch.uint8)
    view[..., 0] = 1  # empty floor
    view[0, 0, 3, 5] = torch.tensor([6, 2, 0])  # a blue ball ahead
    walls = view.clone()
    walls[0, 0, 0, :, 0] = 2  # a wall along one side
    walls[0, 0, 0, :, 1] = 5
    red = view.clone()
    red[0, 0, 3, 5, 1] = 0
    with torch.no_grad():
        plain, walled, recoloured = (
            float(decoder.loss(features, {"image": v}, starts)) for v in (view, walls, red)
        )
    assert plain == pytest.approx(walled)
    assert plain != pytest.approx(recoloured)


def test_objects_only_reads_the_same_logits_as_the_full_head():
    """The picked read-out of object cells equals decoding the whole view and masking."""
    torch.manual_seed(1)
    V, H = 6, 16
    image = torch.ones(V, 1, 7, 7, 3, dtype=torch.uint8)
    image[..., 0] = torch.randint(0, 11, (V, 1, 7, 7))
    image[..., 1] = torch.randint(0, 6, (V, 1, 7, 7))
    features = torch.randn(V, 1, H)
    decoder = ObservationDecoder(H, (7, 7, 3), [0], objects_only=True)
    starts = torch.zeros(V, 1, dtype=torch.bool)
    with torch.no_grad():
        got = float(decoder.loss(features, {"image": image}, starts))
        logits = decoder.heads[0](features[:, 0]).view(V, 49, 17)
        target = image[:, 0].flatten(1, 2).long()
        objects, colors = target[..., 0], target[..., 1]
        ce = torch.nn.functional.cross_entropy
        per_cell = ce(logits[..., :11].transpose(1, 2), objects, reduction="none") + ce(
            logits[..., 11:].transpose(1, 2), colors, reduction="none"
        )
        expected = float((per_cell * (objects >= 4)).sum() / V)
    assert got == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("objects_only", [False, True])
def test_image_loss_averages_each_lags_per_view_loss_over_lags(objects_only):
    """Several lags and episode starts: the batched read-out equals, per lag, the summed cell
    cross-entropy of each valid step's view ``lag`` steps back averaged over those steps, then
    the mean over the lags that have a valid step (lag 9 has none in a chunk of 8)."""
    torch.manual_seed(2)
    L, M, H, lags = 8, 3, 16, [0, 1, 3, 9]
    image = torch.ones(L, M, 7, 7, 3, dtype=torch.uint8)
    image[..., 0] = torch.randint(0, 11, (L, M, 7, 7))
    image[..., 1] = torch.randint(0, 6, (L, M, 7, 7))
    starts = torch.zeros(L, M, dtype=torch.bool)
    starts[0], starts[4, 0], starts[2, 1], starts[5, 1] = True, True, True, True
    features = torch.randn(L, M, H)
    decoder = ObservationDecoder(H, (7, 7, 3), lags, objects_only=objects_only)
    ce = torch.nn.functional.cross_entropy
    terms = []
    with torch.no_grad():
        got = float(decoder.loss(features, {"image": image}, starts))
        for lag, head in zip(lags, decoder.heads, strict=True):
            valid = lag_mask(starts, lag)
            if not valid.any():
                continue
            logits = head(features[lag:][valid[lag:]]).view(-1, 49, 17)  # [V, cells, C]
            target = image[: L - lag][valid[lag:]].flatten(1, 2).long()  # [V, cells, 3]
            objects, colors = target[..., 0], target[..., 1]
            per_cell = ce(logits[..., :11].transpose(1, 2), objects, reduction="none") + ce(
                logits[..., 11:].transpose(1, 2), colors, reduction="none"
            )
            if objects_only:
                per_cell = per_cell * (objects >= 4)
            terms.append(per_cell.sum() / len(target))
    assert len(terms) == 3
    assert got == pytest.approx(float(torch.stack(terms).mean()), rel=1e-5)
