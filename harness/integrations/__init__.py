"""Actions inside the agent frameworks people already use.

Each adapter lives in its own module and imports its framework only when imported itself, so
``import harness`` costs nothing for users who do not install the extras:

- :mod:`harness.integrations.openai_agents`: OpenAI Agents SDK (``[openai-agents]``);
- :mod:`harness.integrations.langchain`: LangChain and LangGraph (``[langchain]``);
- :mod:`harness.integrations.pydantic_ai`: Pydantic AI (``[pydantic-ai]``);
- :mod:`harness.integrations.mcp`: MCP servers and a transactional proxy (``[mcp]``);
- :mod:`harness.integrations.otel`: OpenTelemetry spans (``[otel]``).

A plain ``@hx.action`` already works where a plain function does (``inspect`` takes it for
the function it wraps); an adapter adds what a framework cannot know: that a refused call is
an answer for the model, and that an escalation stops the run for a person.
"""
