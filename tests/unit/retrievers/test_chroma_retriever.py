"""ChromaRetriever's scores on collections of every distance space, unnormalised vectors too."""

from __future__ import annotations

import math
import uuid

import pytest

chromadb = pytest.importorskip("chromadb")

from adarag.retrievers import ChromaRetriever  # noqa: E402

# unnormalised, as a collection written by another tool may hold them (lengths 13 to 210)
VECTORS = {
    "north": [120.0, 10.0, 0.0, 5.0],
    "east": [3.0, 80.0, 20.0, 0.0],
    "south": [-50.0, 4.0, 190.0, 3.0],
    "west": [-9.0, -8.0, 1.0, -2.0],
}
QUERY = [0.6, 0.7, 0.3, 0.2]


class FixedEmbedder:
    """Embeds every query as QUERY, normalised (as adarag's embedders do)."""

    name = "fixed-4"
    dimension = 4

    def embed_documents(self, texts):
        return [self.embed_query(text) for text in texts]

    def embed_query(self, text):
        norm = math.sqrt(sum(x * x for x in QUERY))
        return [x / norm for x in QUERY]


def _cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


@pytest.fixture()
def client():
    client = chromadb.EphemeralClient()
    yield client
    for collection in client.list_collections():
        client.delete_collection(getattr(collection, "name", collection))


@pytest.mark.parametrize("space", ["l2", "ip", "cosine"])
def test_scores_are_cosine_similarities_whatever_the_space_and_vector_lengths(client, space):
    """Regression: an l2 collection of unnormalised vectors scored -172 and -195."""
    collection = client.create_collection(
        f"s-{space}-{uuid.uuid4().hex[:6]}", configuration={"hnsw": {"space": space}}
    )
    collection.add(
        ids=list(VECTORS),
        embeddings=list(VECTORS.values()),
        documents=[f"the {name} passage" for name in VECTORS],
    )
    found = ChromaRetriever(collection, FixedEmbedder()).retrieve("anything", top_k=4)
    assert {chunk.chunk_id for chunk in found} == set(VECTORS)
    for chunk in found:
        assert -1.0 <= chunk.score <= 1.0
        assert chunk.score == pytest.approx(_cosine(QUERY, VECTORS[chunk.chunk_id]), abs=1e-5)
        assert chunk.metadata["space"] == space
    scores = [chunk.score for chunk in found]
    assert scores == sorted(scores, reverse=True)  # best first


class _DirectionFunction(chromadb.EmbeddingFunction):
    """A chromadb embedding function without a config (its base class's get_config)."""

    def __init__(self):
        pass

    def __call__(self, input):
        return [VECTORS.get(text.split()[1], QUERY) for text in input]

    @staticmethod
    def name():
        return "directions-4"


def test_a_chromadb_embedding_function_without_a_config_is_the_embedder(client):
    """Regression: its get_config() returned NotImplemented and the wrapper failed on it."""
    function = _DirectionFunction()
    collection = client.create_collection(f"f-{uuid.uuid4().hex[:6]}", embedding_function=function)
    collection.add(ids=list(VECTORS), documents=[f"the {name} passage" for name in VECTORS])
    found = ChromaRetriever(collection, function).retrieve("the north way", top_k=4)
    assert found[0].chunk_id == "north" and found[0].score == pytest.approx(1.0)
