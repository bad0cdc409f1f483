"""Training: one loop for pretraining and fine-tuning.

state.py      the TrainState: from scratch or a checkpoint, sharded, restored, exported
steps.py      train_step / eval_step and their jit contract (no TensorFlow)
optim.py      Adam / SGD-momentum and schedules from config
guard.py      the non-finite guard: stop, naming the newest intact checkpoint
progress.py   when to log/eval/save, throughput, console lines, summary.json
train.py      the loop: reads the config, tells each room what it needs, runs
miniature.py  the paper's recipe in miniature (pretrain -> fine-tune vs scratch)
"""
