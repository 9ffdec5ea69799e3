"""The "Model library" panel and its sections: the catalog table, the downloads, the local files, the pair
picker and the pair loader."""
