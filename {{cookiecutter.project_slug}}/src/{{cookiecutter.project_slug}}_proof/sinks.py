{%- set module, name = {
  "external_no_reference": ("smtp_sink", "SmtpSink"),
  "external_with_reference": ("fake_provider", "FakeProvider"),
  "same_database": ("effects_table", "EffectsTable"),
}[cookiecutter.effect_kind] -%}
"""Where the replay suite, the try-out and the soak count effects: where they arrive, never inside the job. One
module per kind of effect; this kit's is {{ module }}.py, and `Effects` names its counter for them."""

from .{{ module }} import {{ name }} as Effects

__all__ = ["Effects"]
