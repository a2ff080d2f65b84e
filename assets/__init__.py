"""This deployment's pipelines, built from keel's factories. NYC 2013 flights is the reference pipeline."""
