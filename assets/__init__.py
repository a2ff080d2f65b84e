"""This deployment's pipelines, built from keel's factories for every installed use case."""
