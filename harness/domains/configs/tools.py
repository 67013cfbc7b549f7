"""The configuration tree's tools as plain methods over a folder: six reads, eight writes.

The tree (see ``seed/``)::

    services/<name>/config.json   owner, tier, frozen, image, replicas, depends_on,
                                  feature_flags, env, settings
    services/<name>/routes.ini    the service's HTTP routes (only for services that have any)
    archive/<name>/...            decommissioned services, kept for audit
    registry/images.json          published image tags per service

The write methods do the change and nothing else: the domain's rules (a frozen service cannot be
changed, replicas stay within limits, ...) are the actions' preconditions
(:mod:`harness.domains.configs.actions`), checked by the harness before a write runs. A method
raises :class:`ConfigError` only when it cannot do the change at all (no such service, flag,
route). Every file is replaced atomically (a temporary file renamed over it), so a reader never
sees half a file.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any, Final

from harness.domains.configs.formats import IniSections, dump_ini, dump_json, load_ini, load_json

__all__ = [
    "CRITICAL_MIN_REPLICAS",
    "ENV_NAME",
    "LOG_LEVELS",
    "MAX_REPLICAS",
    "MIN_REPLICAS",
    "READ_TOOLS",
    "REGISTRY_KEY",
    "REQUIRED_ENV",
    "SECRET_PREFIX",
    "SECRET_SUFFIXES",
    "SERVICE_NAME",
    "TAG_FORMAT",
    "WRITE_TOOLS",
    "ConfigError",
    "ConfigTools",
    "archive_key",
    "config_key",
    "remove_file",
    "routes_key",
    "write_text",
]

Record = dict[str, Any]
SettingValue = str | int | float | bool

READ_TOOLS: Final[tuple[str, ...]] = (
    "list_services",
    "read_config",
    "get_setting",
    "read_routes",
    "list_image_tags",
    "find_dependents",
)
"""Tools that only read."""

WRITE_TOOLS: Final[tuple[str, ...]] = (
    "set_replicas",
    "rollout_image",
    "set_feature_flag",
    "set_env_var",
    "remove_env_var",
    "set_setting",
    "set_canary_weight",
    "decommission_service",
)
"""Tools that change files (each one an action)."""

# -- the domain's rules, as data (the preconditions enforce them) ----------------------------

SERVICE_NAME: Final = re.compile(r"^[a-z][a-z0-9-]{0,62}$")
"""What a service name looks like (also keeps a name from reaching outside the tree)."""
MIN_REPLICAS: Final = 1
MAX_REPLICAS: Final = 50
CRITICAL_MIN_REPLICAS: Final = 2
"""A ``critical`` service never runs on fewer replicas than this."""
TAG_FORMAT: Final = re.compile(r"^\d+\.\d+\.\d+$")
"""Release tags only (``MAJOR.MINOR.PATCH``): no pre-releases, no ``latest``."""
ENV_NAME: Final = re.compile(r"^[A-Z][A-Z0-9_]*$")
SECRET_SUFFIXES: Final = ("_PASSWORD", "_SECRET", "_TOKEN", "_KEY")
"""Variables whose name ends so hold a secret: their value must be a vault reference."""
SECRET_PREFIX: Final = "secret://"
REQUIRED_ENV: Final = frozenset({"LOG_LEVEL"})
"""Variables every service keeps."""
LOG_LEVELS: Final = frozenset({"debug", "info", "warn", "error"})
REGISTRY_KEY: Final = "registry/images.json"


def config_key(service: str) -> str:
    """The resource key of a service's configuration file."""
    return f"services/{service}/config.json"


def routes_key(service: str) -> str:
    """The resource key of a service's routes file."""
    return f"services/{service}/routes.ini"


def archive_key(service: str, name: str) -> str:
    """Where a decommissioned service's file ``name`` is kept."""
    return f"archive/{service}/{name}"


class ConfigError(Exception):
    """A tool cannot do what it was asked (no such service, flag, route, setting)."""


def write_text(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically (creating its folder if needed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(text.encode("utf-8"))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def remove_file(path: Path, root: Path) -> None:
    """Delete ``path`` if present, then its folders up to ``root`` that are left empty."""
    path.unlink(missing_ok=True)
    folder = path.parent
    while folder != root and folder.is_relative_to(root):
        try:
            folder.rmdir()
        except OSError:  # not empty (or already gone)
            break
        folder = folder.parent


class ConfigTools:
    """The fourteen tools over one configuration tree.

    Args:
        root: The tree's folder (``services/``, ``archive/``, ``registry/`` inside).
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    # -- files ---------------------------------------------------------------------------

    def path(self, key: str) -> Path:
        """The file of a resource key (refusing keys that leave the tree)."""
        path = (self.root / key).resolve()
        if not path.is_relative_to(self.root.resolve()):
            raise ConfigError(f"{key!r} is outside the configuration tree")
        return path

    def _service(self, service: str) -> Path:
        if not SERVICE_NAME.match(service):
            raise ConfigError(f"{service!r} is not a service name (lowercase letters, digits, -)")
        path = self.path(config_key(service))
        if not path.is_file():
            raise ConfigError(f"no service {service!r}; list_services gives the services")
        return path

    def _config(self, service: str) -> Record:
        config: Record = load_json(self._service(service).read_text(encoding="utf-8"))
        return config

    def _write_config(self, service: str, config: Record) -> None:
        write_text(self.path(config_key(service)), dump_json(config))

    def _routes(self, service: str) -> IniSections:
        self._service(service)
        path = self.path(routes_key(service))
        return load_ini(path.read_text(encoding="utf-8")) if path.is_file() else {}

    def service_names(self) -> list[str]:
        """The active services, sorted."""
        folder = self.root / "services"
        if not folder.is_dir():
            return []
        return sorted(p.parent.name for p in folder.glob("*/config.json"))

    # -- reads ---------------------------------------------------------------------------

    def list_services(self) -> list[Record]:
        """List the active services with their owner, tier, freeze status, image tag and replicas.

        Returns:
            One summary per service, sorted by name. Decommissioned services are not listed.
        """
        rows = []
        for name in self.service_names():
            config = self._config(name)
            rows.append(
                {
                    "service": name,
                    "owner": config["owner"],
                    "tier": config["tier"],
                    "frozen": config["frozen"],
                    "image_tag": config["image"]["tag"],
                    "replicas": config["replicas"],
                }
            )
        return rows

    def read_config(self, service: str) -> Record:
        """Read a service's whole configuration file.

        Args:
            service: The service name, e.g. "search".

        Returns:
            The configuration: owner, tier, frozen and freeze_reason, image (repository, tag,
            previous_tag), replicas, depends_on, feature_flags, env and settings.
        """
        return self._config(service)

    def get_setting(self, service: str, key: str) -> Record:
        """Read one entry of a service's settings.

        Args:
            service: The service name, e.g. "search".
            key: The setting's name, e.g. "timeout_ms".

        Returns:
            The service, the key and its value.
        """
        settings = self._config(service)["settings"]
        if key not in settings:
            raise ConfigError(
                f"service {service!r} has no setting {key!r} (settings: {', '.join(settings)})"
            )
        return {"service": service, "key": key, "value": settings[key]}

    def read_routes(self, service: str) -> IniSections:
        """Read a service's HTTP routes (its routes.ini).

        Args:
            service: The service name, e.g. "checkout".

        Returns:
            Route path -> its options (upstream, canary_upstream when the route has a canary,
            canary_percent, timeout_ms), as text; empty when the service has no routes.
        """
        return self._routes(service)

    def list_image_tags(self, service: str) -> Record:
        """List the image tags published for a service, and the one it runs.

        Args:
            service: The service name, e.g. "catalog".

        Returns:
            The service, the running tag and the published tags, oldest first.
        """
        running = self._config(service)["image"]["tag"]
        registry = load_json(self.path(REGISTRY_KEY).read_text(encoding="utf-8"))
        return {"service": service, "running": running, "published": registry.get(service, [])}

    def find_dependents(self, service: str) -> Record:
        """List the active services whose depends_on names a service.

        Args:
            service: The service name, e.g. "catalog".

        Returns:
            The service and its dependents, sorted.
        """
        self._service(service)
        dependents = [
            name
            for name in self.service_names()
            if name != service and service in self._config(name)["depends_on"]
        ]
        return {"service": service, "dependents": dependents}

    # -- writes --------------------------------------------------------------------------

    def set_replicas(self, service: str, replicas: int) -> Record:
        """Scale a service to a number of replicas.

        Args:
            service: The service name, e.g. "search".
            replicas: The new replica count: 1 to 50, and at least 2 for a critical service.

        Returns:
            The service, the new and the previous replica count.
        """
        config = self._config(service)
        previous = config["replicas"]
        config["replicas"] = replicas
        self._write_config(service, config)
        return {"service": service, "replicas": replicas, "previous": previous}

    def rollout_image(self, service: str, tag: str) -> Record:
        """Roll a service out to another published image tag (the running one becomes previous).

        Args:
            service: The service name, e.g. "catalog".
            tag: A published release tag MAJOR.MINOR.PATCH, e.g. "1.13.1" (no pre-releases).

        Returns:
            The service, the new tag and the previous tag.
        """
        config = self._config(service)
        previous = config["image"]["tag"]
        config["image"]["previous_tag"] = previous
        config["image"]["tag"] = tag
        self._write_config(service, config)
        return {"service": service, "tag": tag, "previous_tag": previous}

    def set_feature_flag(self, service: str, flag: str, enabled: bool) -> Record:
        """Turn an existing feature flag of a service on or off.

        Args:
            service: The service name, e.g. "notifications".
            flag: The flag's name; it must already exist in the service's feature_flags.
            enabled: True to turn it on, False to turn it off.

        Returns:
            The service, the flag, its new and its previous value.
        """
        config = self._config(service)
        flags = config["feature_flags"]
        if flag not in flags:
            raise ConfigError(f"service {service!r} has no feature flag {flag!r}")
        previous = flags[flag]
        flags[flag] = enabled
        self._write_config(service, config)
        return {"service": service, "flag": flag, "enabled": enabled, "previous": previous}

    def set_env_var(self, service: str, name: str, value: str) -> Record:
        """Add an environment variable to a service, or change its value.

        Args:
            service: The service name, e.g. "inventory".
            name: The variable's name, UPPER_SNAKE_CASE. Names ending in _PASSWORD, _SECRET,
                _TOKEN or _KEY hold secrets: their value must be a "secret://..." reference.
            value: The value. LOG_LEVEL takes debug, info, warn or error.

        Returns:
            The service, the variable, its new value and its previous one (null if it is new).
        """
        config = self._config(service)
        previous = config["env"].get(name)
        config["env"][name] = value
        self._write_config(service, config)
        return {"service": service, "name": name, "value": value, "previous": previous}

    def remove_env_var(self, service: str, name: str) -> Record:
        """Remove an environment variable from a service (LOG_LEVEL cannot be removed).

        Args:
            service: The service name, e.g. "inventory".
            name: The variable's name.

        Returns:
            The service, the variable and the value it had.
        """
        config = self._config(service)
        if name not in config["env"]:
            raise ConfigError(f"service {service!r} has no environment variable {name!r}")
        previous = config["env"].pop(name)
        self._write_config(service, config)
        return {"service": service, "name": name, "previous": previous}

    def set_setting(self, service: str, key: str, value: SettingValue) -> Record:
        """Change an existing setting of a service (settings cannot be added or change type).

        Args:
            service: The service name, e.g. "search".
            key: The setting's name, e.g. "timeout_ms"; it must already exist.
            value: The new value, of the setting's type (a whole number is accepted for a
                decimal setting).

        Returns:
            The service, the setting, its new and its previous value.
        """
        config = self._config(service)
        settings = config["settings"]
        if key not in settings:
            raise ConfigError(f"service {service!r} has no setting {key!r}")
        previous = settings[key]
        if isinstance(previous, float) and type(value) is int:
            value = float(value)
        settings[key] = value
        self._write_config(service, config)
        return {"service": service, "key": key, "value": value, "previous": previous}

    def set_canary_weight(self, service: str, route: str, percent: int) -> Record:
        """Send a percentage of a route's traffic to its canary upstream (0 sends none).

        Args:
            service: The service name, e.g. "search".
            route: The route path as read_routes gives it, e.g. "/v1/search".
            percent: Share of traffic for the canary, 0 to 100.

        Returns:
            The service, the route, the new and the previous percentage.
        """
        routes = self._routes(service)
        if route not in routes:
            raise ConfigError(f"service {service!r} has no route {route!r}")
        previous = int(routes[route]["canary_percent"])
        routes[route]["canary_percent"] = str(percent)
        write_text(self.path(routes_key(service)), dump_ini(routes))
        return {"service": service, "route": route, "percent": percent, "previous": previous}

    def decommission_service(self, service: str) -> Record:
        """Decommission a service: move its files to archive/<service>/ and stop listing it.

        Args:
            service: The service name; nothing active may depend on it, and it must be neither
                frozen nor critical.

        Returns:
            The service and the archived files.
        """
        self._service(service)
        moved = []
        for name in ("config.json", "routes.ini"):
            source = self.path(f"services/{service}/{name}")
            if not source.is_file():
                continue
            target = self.path(archive_key(service, name))
            write_text(target, source.read_text(encoding="utf-8"))
            remove_file(source, self.root)
            moved.append(archive_key(service, name))
        return {"service": service, "archived": moved}
