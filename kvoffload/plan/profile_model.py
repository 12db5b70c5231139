"""A profile belongs to the model its engine was timed on: a plan for another model either
refuses it, naming both and the command that makes the right one, or (asked to) scales the
engine's terms by the models' FLOPs per token and says every TTFT figure is scaled."""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvoffload.plan.model_shape import KVShape, kv_shape
from kvoffload.plan.profile import Profile, ProfileError


def _timed_on(profile: Profile) -> tuple[str, int]:
    """(signature, parameters) of the model the profile's engine was timed on ("" unknown); a
    profile written before it said so names a built-in model at most."""
    eng = profile.engine
    if eng.shape:
        return eng.shape, eng.params
    from kvoffload.engine.model_config import BUILTIN_MODELS

    if eng.model in BUILTIN_MODELS:
        shape = kv_shape(eng.model)
        return shape.signature, shape.params
    return "", 0


@dataclass(frozen=True, slots=True)
class FittedProfile:
    profile: Profile
    #: A line for the report (None: nothing to say).
    note: str | None = None
    #: The engine's terms were scaled from another model's: every TTFT figure is a guess.
    scaled: bool = False


def fit_profile(profile: Profile, shape: KVShape, model_flag: str, source: str, scale: bool = False) -> FittedProfile:
    """The profile to price ``shape``'s plan with. Raises ProfileError for another model's
    profile unless ``scale``."""
    timed, params = _timed_on(profile)
    if not timed:
        return FittedProfile(profile, f"note: {source} does not say which model its engine was timed on; its TTFT "
                                      f"figures are taken as {model_flag}'s")
    if timed == shape.signature:
        return FittedProfile(profile)
    name = profile.engine.model or "another model"
    if not scale:
        raise ProfileError(
            f"{source}: its engine was timed on {name} ({timed}), not on --model {model_flag} ({shape.signature}), "
            f"so its time to first token would be another model's; time this one with `kvoffload bench profile "
            f"--model {model_flag} --out profile.yaml` and pass --profile profile.yaml, or pass --scale-profile to "
            "scale the engine's times by FLOPs per token")
    if not (params and shape.params):
        raise ProfileError(f"--scale-profile: the parameter count of {'--model ' + model_flag if params else name} is "
                           "unknown (its config.json needs hidden_size and intermediate_size), so its FLOPs per "
                           "token cannot be compared; time the model with `kvoffload bench profile` instead")
    engine = profile.engine.scaled(shape.name, shape.signature, shape.params)
    note = (f"note: TTFT figures are scaled, not measured: {source} timed {name} ({timed}); its per-token times "
            f"were multiplied by {shape.params / params:,.2f} (FLOPs per token of {shape.name}: "
            f"{shape.params / 1e6:,.1f}M parameters)")
    return FittedProfile(replace(profile, engine=engine), note, scaled=True)
