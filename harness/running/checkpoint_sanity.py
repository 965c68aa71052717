"""A user's checkpoint, tried before it is certified: is the base model better than chance?

A checkpoint read with the wrong label order, without (or with a second) normalization,
or for pixels in [0, 255] certifies silently at chance accuracy. Before certifying a
``[model] checkpoint``, the run measures the base model's clean accuracy (no noise) on
the test subset; when it is near chance — below chance + (1 − chance)/4, chance being the
frequency of the subset's commonest label — each likely cause is tried by correcting
the input or the labels and measuring again:

- **label order**: the confusion matrix's best one-to-one relabelling (the assignment
  of predicted to true classes maximizing the matches, Kuhn 1955), tried when the subset
  has at least two inputs per class (with fewer, any prediction can be matched);
- **missing normalization**: the inputs standardized per channel by the subset's mean
  and standard deviation, (x − μ)/s (the model expects normalized inputs and has no
  normalization layer);
- **doubled normalization**: the inputs un-standardized, μ + s·x (the model normalizes
  inside, and its network normalizes again or was trained on raw pixels);
- **pixel range**: 255·x (the model was trained on pixels in [0, 255]).

A correction that brings the accuracy above the near-chance line and doubles it is
reported as the likely cause, with its fix, in one warning line.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

FIXES = {
    "label order": "its classes are in another order than the dataset's labels (e.g. ImageNet "
    "class folders not named by WordNet id in sorted order, as ImageFolder indexes them, or a "
    "dataset with other label indices): give the dataset its classes in the model's order, or "
    "permute the rows of the model's last layer",
    "missing normalization": "it expects normalized inputs and has no normalization layer: "
    "read Cohen et al.'s and SmoothAdv's files with format = \"cohen\" (their NormalizeLayer), "
    "set [model] architecture_params = { normalization = DATASET }, or put the normalization "
    "inside the TorchScript model",
    "doubled normalization": "its inputs are normalized twice, or normalized when it was trained "
    'on raw pixels: set [model] architecture_params = { normalization = "none" }, or remove the '
    "normalization from the exported model",
    "pixel range": "it was trained on pixels in [0, 255], the harness's inputs are in [0, 1] "
    "(noise is added there): export the model with its input scaling (x·255) inside, or retrain "
    "it on [0, 1]",
}
"""The fix of each cause, as the warning states it."""


@dataclass(frozen=True)
class SanityReport:
    """The base model's clean accuracy on the test subset and what each correction gives."""

    accuracy: float
    chance: float
    inputs: int
    corrected: dict[str, float]  # cause -> accuracy with that correction

    @property
    def near_chance(self) -> bool:
        return self.accuracy < self.chance + (1 - self.chance) / 4

    def likely_cause(self) -> str | None:
        """The correction that recovers accuracy best, if it clearly does."""
        if not self.near_chance or not self.corrected:
            return None
        cause, best = max(self.corrected.items(), key=lambda item: item[1])
        line = self.chance + (1 - self.chance) / 4
        return cause if best >= line and best >= 2 * self.accuracy else None

    def warning(self, checkpoint: str) -> str | None:
        """One line for the user, or None when the model is not near chance."""
        if not self.near_chance:
            return None
        head = (
            f"the base model from {checkpoint} classifies {self.accuracy:.1%} of the "
            f"{self.inputs} test inputs correctly (chance: {self.chance:.1%}); "
        )
        cause = self.likely_cause()
        if cause is None:
            tried = ", ".join(f"{c} {a:.1%}" for c, a in self.corrected.items())
            return head + (
                f"no usual cause recovers it (tried: {tried}): check that the checkpoint fits "
                "this dataset and its preprocessing"
            )
        return head + (
            f"likely cause: {cause} (corrected, it scores {self.corrected[cause]:.1%}): "
            + FIXES[cause]
        )


def _predict(model: torch.nn.Module, x: torch.Tensor, device, batch: int = 256) -> np.ndarray:
    out = []
    with torch.no_grad():
        for start in range(0, len(x), batch):
            out.append(model(x[start : start + batch].to(device)).argmax(-1).cpu())
    return torch.cat(out).numpy()


def best_relabelling(labels: np.ndarray, predictions: np.ndarray, classes: int) -> float:
    """Accuracy after the one-to-one relabelling of predicted classes that matches the
    most inputs (a maximum-weight assignment on the confusion matrix)."""
    from scipy.optimize import linear_sum_assignment

    confusion = np.zeros((classes, classes), dtype=np.int64)
    valid = (predictions >= 0) & (predictions < classes)
    np.add.at(confusion, (predictions[valid], labels[valid]), 1)
    rows, cols = linear_sum_assignment(confusion, maximize=True)
    return float(confusion[rows, cols].sum()) / len(labels)


def check_base_model(
    model: torch.nn.Module, inputs: torch.Tensor, labels: torch.Tensor, classes: int, device
) -> SanityReport:
    """Clean accuracy of ``model`` on ``inputs`` and, when it is near chance, the accuracy
    under each correction (module docstring)."""
    y = labels.cpu().numpy()
    chance = float(np.bincount(y, minlength=classes).max()) / len(y)
    accuracy = float(np.mean(_predict(model, inputs, device) == y))
    report = SanityReport(accuracy, chance, len(y), {})
    if not report.near_chance:
        return report
    x = inputs.float()
    per_channel = [0, *range(2, x.dim())] if x.dim() > 2 else list(range(x.dim()))
    mean = x.mean(dim=per_channel, keepdim=True)
    std = x.std(dim=per_channel, keepdim=True).clamp_min(1e-8)
    corrected = {
        "missing normalization": (x - mean) / std,
        "doubled normalization": mean + std * x,
        "pixel range": 255.0 * x,
    }
    accuracies = {c: float(np.mean(_predict(model, v, device) == y)) for c, v in corrected.items()}
    if len(y) >= 2 * classes:
        accuracies = {"label order": best_relabelling(y, _predict(model, inputs, device), classes),
                      **accuracies}  # fmt: skip
    return SanityReport(accuracy, chance, len(y), accuracies)
