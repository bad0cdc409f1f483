"""Looking inside a ViT: the figures of the paper's section 4.5 and their numbers.

  filters.py    PCA of the patch-embedding filters (plain ViTs; hybrids have none on pixels)
  posemb.py     cosine similarity of position embeddings, one map per patch position
  attention.py  mean attention distance per head; attention rollout (Abnar & Zuidema 2020);
                NaFlex batches' values on each image's own grid (on_grids)
  relevance.py  class-specific relevance maps (Chefer, Gur and Wolf 2021)
  plots.py      the PNGs (matplotlib, optional extra 'plot')
  report.py     everything for one model and some images: compute(), write()

The command is `python -m vit_jax.figures` (vit_jax/figures.py).
"""

from vit_jax.inspection.attention import (
    attention_rollout,
    flow,
    mean_attention_distance,
    on_grids,
    pairwise_distances,
    patch_centres,
    rollout_maps,
    upsample,
)
from vit_jax.inspection.filters import FilterPCA, NotPixelFilters, embedding_kernel, filter_pca
from vit_jax.inspection.posemb import NoPositionEmbeddings, cosine_similarity_maps, patch_embeddings
from vit_jax.inspection.relevance import relevance
from vit_jax.inspection.report import (
    Inspection,
    analyse_images,
    compute,
    explain,
    naflex_images,
    sample_images,
    write,
)
