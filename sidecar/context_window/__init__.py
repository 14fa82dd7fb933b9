"""The context-window area: profiles and tasks, the declared section layout, the policy and its
plugins, renderings for the providers, and agent state."""
