"""The agent: an LLM learned beside an engine that plays its episodes, or with its tasks played in-process.

Modules: `episodes` (the episode schema, read from an engine's files), `feed` (the files followed as they grow),
`learner` (`EpisodeLearner`: every algorithm on episodes, LoRA, a mesh), `lm_learn` (`lm learn`'s loop: episodes
in, versioned weights out), `retrieval_qa` (Search-R1's task: its files, the retriever, the turn loop and its
training loop), `compiled_memory` (XLA's memory count of the learner's compiled update at a model's sizes).
The agent and the lab (`ftw_jax.lab`) never import each other.
"""
