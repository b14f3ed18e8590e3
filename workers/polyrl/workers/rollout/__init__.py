"""The rollout worker process: serves a policy's generation requests with an engine
(`engines`: torch, vLLM) behind one interface (`worker`), keeping its weights at the latest
published version (`weights`, over `polyrl.workers.weightsync`); `main` builds it."""
