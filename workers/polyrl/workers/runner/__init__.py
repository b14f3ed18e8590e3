"""The workflow runner process: runs episodes `episodesInFlight` at a time (`runner`), asks
the policies' rollout pools for completions (`generation`), watches what the trainers publish
(`trainers`), keeps generation within `maxStaleness` of training (`admission`, with
`staleness`; `rounds` in sync mode), holds an episode's samples until its groups are whole
(`uniform_groups`), and emits scored trajectories to each policy's trainer (`emission`)."""
