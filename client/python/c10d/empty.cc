// Intentionally empty: tributary_client_shared is the whole-archived client libraries.
