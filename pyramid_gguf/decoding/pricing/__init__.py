"""What ``auto`` decides with: chains and their prices (:mod:`.chains`), the policy's arithmetic
(:mod:`.policy`), online keep-rate estimates (:mod:`.estimates`) and batch cost curves
(:mod:`.costs`). Pure: never imports llama.cpp, so the planner and replays price without it."""
