"""State on disk: the strategy checkpoint (:mod:`.checkpoint`), with its metrics history
sidecar (:mod:`.history`), its one-writer lock (:mod:`.lock`), the run's identity
(:mod:`.identity`) and the generators' states (:mod:`.random_state`), and the ``.npz``
store both it and the clients' persisted state use (:mod:`.npz_store`). No ``flwr`` import."""
