//! Walk the states named on the command line and print their layout (a debugging aid).
fn main() {
    for p in std::env::args().skip(1) {
        match kvfast_core::State::open(&p, Default::default()) {
            Ok(s) => {
                let l = &s.layout;
                let (rows, outs, meta) = l.byte_totals();
                println!(
                    "{p}: {} v{:?} arch={:?} seq={:?} tokens={:?} ext={} feats={:?} caches={} rows={rows} outputs={outs} meta={meta} size={}",
                    l.container.name(), l.version, l.arch, l.seq_id, l.tokens.as_ref().map(|t| t.len()),
                    l.ext_bytes, l.features, l.caches.len(), l.size
                );
                for (ci, c) in l.caches.iter().enumerate() {
                    for s in &c.streams {
                        let nl = s.layers.len();
                        let l0 = s.layers.first();
                        println!("  cache {ci} stream {} cells={} vtrans={} layers={nl} k={:?} v={:?} pos={:?} seqs={:?}",
                            s.index, s.cell_count, s.v_trans,
                            l0.map(|l| (l.k.ty.name(), l.k.n_embd)), l0.and_then(|l| l.v.as_ref()).map(|v| (v.ty.name(), v.n_embd)),
                            &s.pos[..s.pos.len().min(16)], &s.seq_ids[..s.seq_ids.len().min(20)]);
                    }
                }
            }
            Err(e) => println!("{p}: ERROR [{}] {e}", e.kind()),
        }
    }
}
