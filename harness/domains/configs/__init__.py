"""A service-configuration domain whose state is files: an operations agent edits a tree.

Twelve services, each a ``services/<name>/config.json`` (owner, tier, freeze, image, replicas,
dependencies, feature flags, environment, settings) and, for some, a ``routes.ini``; an
``archive/`` of decommissioned services and a ``registry/images.json`` of published tags.
:class:`ConfigsEnvironment` gives each trial its own copy, tracked by :class:`hx.FileState`,
with six read tools and eight write actions whose preconditions are the domain's rules
(:data:`POLICY`).
"""

from harness.domains.configs.environment import POLICY, ConfigsEnvironment, seed_tree
from harness.domains.configs.tools import READ_TOOLS, WRITE_TOOLS, ConfigError, ConfigTools

__all__ = [
    "POLICY",
    "READ_TOOLS",
    "WRITE_TOOLS",
    "ConfigError",
    "ConfigTools",
    "ConfigsEnvironment",
    "seed_tree",
]
