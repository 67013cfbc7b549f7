"""Agents: the protocol, the toolbox, the built-in agents (scripted, simulated, openai), and
agents named by the user as ``module:Class`` or ``path/to/file.py:Class`` (:mod:`.spec`).
Users the ``openai`` agent converses with in tau2-bench's loop: the protocol and the built-in
users (scripted, openai; :mod:`.user`)."""

from ..errors import ModelRequestError, ModelServerError
from .base import Agent, AgentOutput, AgentRegistry, CallRecord, Toolbox, ToolResult, registry
from .openai import OpenAIAgent, OpenAIUser
from .scripted import ScriptedAgent
from .simulated import SimulatedAgent
from .spec import AgentSpec, is_agent_spec, recorded_spec
from .user import ScriptedUser, User, UserRegistry, UserTurn, user_registry

__all__ = [
    "Agent",
    "AgentOutput",
    "AgentRegistry",
    "AgentSpec",
    "CallRecord",
    "ModelRequestError",
    "ModelServerError",
    "OpenAIAgent",
    "OpenAIUser",
    "ScriptedAgent",
    "ScriptedUser",
    "SimulatedAgent",
    "ToolResult",
    "Toolbox",
    "User",
    "UserRegistry",
    "UserTurn",
    "is_agent_spec",
    "recorded_spec",
    "registry",
    "user_registry",
]
