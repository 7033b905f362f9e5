"""The write client (plan, execute, commit), write handles, insert placement, conflict checks."""
