"""JSON Schema (draft 2020-12) of a board's ``NAME.json`` (format ``idrs-bench/leaderboard/4``)."""

from __future__ import annotations

_NUMBER_OR_NULL = {"type": ["number", "null"]}

_PROTOCOL = {
    "type": "object",
    "required": [
        "run_id", "name", "dataset", "test_every", "test_count", "inputs", "n0", "n", "alpha",
        "batch_size", "architecture", "architecture_params", "trainer", "trainer_params",
        "model_seed", "recipe_hash", "seed", "device", "versions", "git_commit", "created",
        "finished", "spec_file", "command",
    ],
    "properties": {
        "run_id": {"type": "string"},
        "name": {"type": "string"},
        "dataset": {"type": "string"},
        "test_every": {"type": "integer", "minimum": 1},
        "test_count": {"type": ["integer", "null"]},
        "inputs": {"type": "integer", "minimum": 0},
        "n0": {"type": "integer", "minimum": 1},
        "n": {"type": "integer", "minimum": 1},
        "alpha": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
        "batch_size": {"type": ["integer", "string", "null"]},
        "precision": {"enum": ["fp32", "tf32", "tf32-conv", "bf16", "fp16"]},
        "channels_last": {"type": "boolean"},
        "noise": {"type": "string"},
        "cudnn": {"enum": ["heuristic", "benchmark"]},
        "fold_batchnorm": {"type": "boolean"},
        "compile": {"type": "boolean"},
        "cuda_graphs": {"type": "boolean"},
        "sampling": {"enum": ["fixed", "sequential"]},
        "n_max": {"type": "integer", "minimum": 1},
        "architecture": {"type": "string"},
        "architecture_params": {"type": "object"},
        "trainer": {"type": "string"},
        "trainer_params": {"type": "object"},
        "model_seed": {"type": "integer"},
        "recipe_hash": {"type": ["string", "null"]},
        "weights_digest": {"type": "string", "pattern": "^[0-9a-f]{64}$"},  # the parameters'
        "weights_file_sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},  # shipped file's
        "arithmetic": {"type": "object"},
        "plugin_hosts": {"type": "object"},
        "test_split": {"enum": ["withheld"]},
        "seed": {"type": "integer"},
        "device": {"type": "string"},
        "versions": {"type": "object", "additionalProperties": {"type": "string"}},
        "git_commit": {"type": ["string", "null"]},
        "created": {"type": "string"},
        "finished": {"type": ["string", "null"]},
        "spec_file": {"type": "string"},
        "command": {"type": "string"},
    },
}  # fmt: skip

_ROW = {
    "type": "object",
    "required": [
        "table", "section", "rank", "run_id", "dataset", "recipe_hash", "method", "setting",
        "verdict", "sound", "inputs", "clean_accuracy", "acr", "abstention_rate",
        "misclassification_rate", "classwise_accuracy_min", "classwise_accuracy_max",
        "classwise_accuracy_std", "mean_sigma", "sigma_min", "sigma_median", "sigma_max",
        "seconds_per_input", "classwise_accuracy", "intervals", "best_at", "differences",
    ],
    "properties": {
        "table": {"type": "integer", "minimum": 1},
        "section": {"enum": ["sound", "order-dependent", "not-certified", "imported"]},
        "rank": {"type": "integer", "minimum": 1},
        "run_id": {"type": "string"},
        "method": {"type": "string"},
        "setting": {"type": "string"},
        "verdict": {"type": "string"},
        "sound": {"type": "boolean"},
        "checks_applied": {"type": "array", "items": {"type": "string"}},
        "inputs": {"type": "integer", "minimum": 1},
        "classwise_accuracy": {
            "type": "object",
            "patternProperties": {"^-?[0-9]+$": {"type": "number", "minimum": 0, "maximum": 1}},
            "additionalProperties": False,
        },
        "intervals": {  # 95 % Clopper–Pearson [low, high] of each accuracy over test inputs
            "type": "object",
            "patternProperties": {
                "^(clean_accuracy|certified_accuracy@.+|empirical_accuracy@.+)$": {
                    "type": "array", "minItems": 2, "maxItems": 2,
                    "items": {"type": "number", "minimum": 0, "maximum": 1},
                },
                "^acr$": {  # Student's t interval of the mean radius, clipped at 0
                    "type": "array", "minItems": 2, "maxItems": 2,
                    "items": {"type": "number", "minimum": 0},
                },
            },
            "additionalProperties": False,
        },
        "best_at": {"type": "array", "items": {"type": "number", "minimum": 0}},
        "differences": {  # per radius: minus the table's reference row (null: none, not paired)
            "type": "object",
            "additionalProperties": {
                "type": ["object", "null"],
                "required": ["radius", "inputs", "row_only", "reference_only", "difference",
                             "low", "high", "reading"],
                "additionalProperties": False,
                "properties": {
                    "radius": {"type": "number", "minimum": 0},
                    "inputs": {"type": "integer", "minimum": 1},
                    "row_only": {"type": "integer", "minimum": 0},
                    "reference_only": {"type": "integer", "minimum": 0},
                    "difference": {"type": "number", "minimum": -1, "maximum": 1},
                    "low": {"type": "number", "minimum": -1, "maximum": 1},
                    "high": {"type": "number", "minimum": -1, "maximum": 1},
                    "reading": {"enum": ["above", "below", "not separated"]},
                },
            },
        },
    },
    "patternProperties": {
        "^(clean_accuracy|certified_accuracy@.+|empirical_accuracy@.+|abstention_rate"
        "|misclassification_rate|classwise_accuracy_(min|max|std))$": {
            "type": ["number", "null"], "minimum": 0, "maximum": 1},
        "^(acr|mean_sigma|sigma_(min|median|max)|seconds_per_input|load_per_core|samples_mean"
        "|samples_max)$": {
            "type": ["number", "null"], "minimum": 0},
    },
}  # fmt: skip

BOARD_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "idrs-bench leaderboard",
    "type": "object",
    "required": ["format", "title", "runs", "metrics", "tables", "rows", "failures"],
    "additionalProperties": False,
    "properties": {
        "format": {"const": "idrs-bench/leaderboard/4"},
        "title": {"type": "string"},
        "runs": {"type": "array", "items": _PROTOCOL, "minItems": 1},
        "metrics": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["key", "header", "higher_is_better", "description"],
                "additionalProperties": False,
                "properties": {
                    "key": {"type": "string"},
                    "header": {"type": "string"},
                    "higher_is_better": {"type": ["boolean", "null"]},
                    "description": {"type": "string"},
                },
            },
        },
        "tables": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["index", "dataset", "architecture", "recipe_hash", "radii",
                             "headline_radius", "runs", "references", "plots"],
                "properties": {
                    "index": {"type": "integer", "minimum": 1},
                    "radii": {"type": "array", "items": {"type": "number", "minimum": 0}},
                    "headline_radius": {"type": "number", "minimum": 0},
                    "runs": {"type": "array", "items": {"type": "string"}},
                    "references": {  # per base model and radius: its best sound constant-σ row
                        "type": "object",
                        "additionalProperties": {
                            "type": "object",
                            "additionalProperties": {
                                "type": ["object", "null"],  # null: none
                                "required": ["run_id", "method", "setting"],
                                "additionalProperties": {"type": "string"},
                            },
                        },
                    },
                    "seeds": {  # rows over training seeds (harness.reports.leaderboard.seeds)
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["method", "setting", "seeds", "runs", "metrics",
                                         "across_seeds"],
                        },
                    },
                    "plots": {
                        "type": "object",
                        "required": ["certified_accuracy", "classwise_accuracy"],
                        "additionalProperties": {"type": "string", "pattern": "\\.png$"},
                    },
                },
            },
        },
        "rows": {"type": "array", "items": _ROW},
        "failures": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["run_id", "method", "setting", "error"],
                "additionalProperties": {"type": "string"},
            },
        },
    },
}  # fmt: skip
