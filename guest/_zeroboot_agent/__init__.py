"""The guest agent, as one package whose name no user module can take (`import agent` or
`import utils` in a notebook must find the user's file, never the agent's)."""
