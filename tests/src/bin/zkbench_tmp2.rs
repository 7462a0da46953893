// TEMPORARY experiment (to be deleted).
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zookeeper_client as zk;

fn cpu_of(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let f: Vec<&str> = s.rsplit(')').next().unwrap().split_whitespace().collect();
    (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / 100.0
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args[1].parse().unwrap();
    let secs: f64 = args[2].parse().unwrap();
    let server = tokio::task::spawn_blocking(fencelock_integration::zookeeper::ZkServer::start).await.unwrap();
    let cs = server.connect_string();
    for which in ["ours", "recipe", "ours", "recipe"] {
        let stop = Arc::new(AtomicBool::new(false));
        let count = Arc::new(AtomicU64::new(0));
        let mut tasks = vec![];
        let mut keep = vec![];
        for _ in 0..n {
            let (stop, count) = (stop.clone(), count.clone());
            if which == "ours" {
                let b = fencelock_zookeeper::ZooKeeperBackend::connect(&cs).await.unwrap();
                let s = fencelock::Session::builder(b).namespace("b").ttl(Duration::from_secs(10)).start().await.unwrap();
                let m = s.mutex("c").unwrap();
                keep.push(s);
                tasks.push(tokio::spawn(async move { while !stop.load(Ordering::Relaxed) { let g = m.lock().await.unwrap(); g.release().await.unwrap(); count.fetch_add(1, Ordering::Relaxed);} }));
            } else {
                let c = zk::Client::connect(&cs).await.unwrap();
                tasks.push(tokio::spawn(async move { while !stop.load(Ordering::Relaxed) {
                    let lock = c.lock(zk::LockPrefix::new_curator("/b/r", "lock-").unwrap(), b"", zk::LockOptions::new(zk::Acls::anyone_all()).with_ancestor_options(zk::CreateMode::Container.with_acls(zk::Acls::anyone_all())).unwrap()).await.unwrap();
                    c.delete(lock.lock_path(), None).await.unwrap();
                    std::mem::forget(lock);
                    count.fetch_add(1, Ordering::Relaxed);} }));
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let c0 = count.load(Ordering::Relaxed);
        let (zk0, me0) = (cpu_of(server.pid()), cpu_of(std::process::id()));
        let t0 = Instant::now();
        tokio::time::sleep(Duration::from_secs_f64(secs)).await;
        let c1 = count.load(Ordering::Relaxed);
        let el = t0.elapsed().as_secs_f64();
        let (zk1, me1) = (cpu_of(server.pid()), cpu_of(std::process::id()));
        stop.store(true, Ordering::Relaxed);
        for t in tasks { t.await.unwrap(); }
        let rate = (c1 - c0) as f64 / el;
        println!("{which:7} n={n}: {rate:.0}/s  zk cpu {:.2} cores ({:.0} us/acq)  client cpu {:.2} cores ({:.0} us/acq)",
            (zk1-zk0)/el, (zk1-zk0)/((c1-c0) as f64)*1e6, (me1-me0)/el, (me1-me0)/((c1-c0) as f64)*1e6);
        drop(keep);
    }
}
