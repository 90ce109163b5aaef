compile_error!("the wiredtiger peer is not written yet");
