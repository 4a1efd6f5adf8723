"""The transaction coordinator: state machines, the transaction log, and the operations on it."""
