compile_error!("the lmdb peer is not written yet");
