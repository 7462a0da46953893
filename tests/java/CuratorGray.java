// Apache Curator's InterProcessMutex under a gray failure, for fencelock's benchmark
// (bench/src/gray.rs): N sessions (one CuratorFramework, hence one ZooKeeper connection,
// each) loop acquire + release on one lock path, each in a thread of its own, while a server of
// the ensemble is paused by the harness. The first session is the *measured* one.
//
//   java -cp <classes>:<curator jars> CuratorGray <connect-string> <lock-path> <sessions> \
//        <session-timeout-ms> <connection-timeout-ms> <beat-period-ms>
//
// Protocol (stdout, one line each; times are System.currentTimeMillis()):
//   at start, the measured session alone is connected:  SESSION <hex session id>
//   stdin "REOPEN": the measured session is closed and a new one opened: SESSION <hex id>
//   stdin "START": the other sessions connect, every session starts its loop, the measured one
//     also a heartbeat loop and a ConnectionStateListener:              STARTED
//   then, while running:
//     GRANT <ms> [<ms> ...]   grants (batched every 20 ms), the time each acquire() returned
//     BEAT <ms>               the measured session's checkExists("/") (sent every
//                             <beat-period-ms>, in the background) answered within the period
//     STATE <ms> <state>      the measured session's ConnectionState (SUSPENDED, RECONNECTED,
//                             LOST, ...)
//     SESSION <hex id>        the measured session's id, whenever it changes
//   stdin "STOP" or stdin closed: the loops stop, the sessions close, STOPPED, exit 0.
// Errors print "ERROR <message>" and exit 3.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.RetryNTimes;

public class CuratorGray {
    static synchronized void say(String line) {
        System.out.println(line);
        System.out.flush();
    }

    static String connect;
    static int sessionMs;
    static int connectionMs;

    static CuratorFramework open() throws Exception {
        CuratorFramework c = CuratorFrameworkFactory.builder()
                .connectString(connect)
                .sessionTimeoutMs(sessionMs)
                .connectionTimeoutMs(connectionMs)
                .retryPolicy(new RetryNTimes(3, 200))
                .build();
        c.start();
        if (!c.blockUntilConnected(30, TimeUnit.SECONDS)) {
            throw new IllegalStateException("not connected to " + connect);
        }
        return c;
    }

    /** The session id of `c`'s current ZooKeeper handle; 0 while it has none. */
    static long sessionId(CuratorFramework c) {
        try {
            return c.getZookeeperClient().getZooKeeper().getSessionId();
        } catch (Exception e) {
            return 0;
        }
    }

    static final AtomicLong lastSession = new AtomicLong();

    /** Prints SESSION when the measured session's id is known and new. */
    static void noteSession(CuratorFramework c) {
        long id = sessionId(c);
        if (id != 0 && lastSession.getAndSet(id) != id) {
            say("SESSION " + Long.toHexString(id));
        }
    }

    public static void main(String[] args) {
        if (args.length != 6) {
            System.err.println("usage: CuratorGray <connect-string> <lock-path> <sessions> "
                    + "<session-timeout-ms> <connection-timeout-ms> <beat-period-ms>");
            System.exit(64);
        }
        try {
            connect = args[0];
            sessionMs = Integer.parseInt(args[3]);
            connectionMs = Integer.parseInt(args[4]);
            run(args[1], Integer.parseInt(args[2]), Long.parseLong(args[5]));
            System.exit(0);
        } catch (Exception e) {
            say("ERROR " + e);
            System.exit(3);
        }
    }

    static void run(String path, int sessions, long beatMs) throws Exception {
        BufferedReader stdin = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        CuratorFramework measured = open();
        noteSession(measured);
        // Placement: reopen the measured session until the harness is content.
        while (true) {
            String line = stdin.readLine();
            if (line == null || line.trim().equals("STOP")) {
                measured.close();
                say("STOPPED");
                return;
            }
            if (line.trim().equals("START")) {
                break;
            }
            if (line.trim().equals("REOPEN")) {
                measured.close();
                measured = open();
                noteSession(measured);
            }
        }
        final CuratorFramework first = measured;
        List<CuratorFramework> clients = new ArrayList<>();
        clients.add(first);
        for (int i = 1; i < sessions; i++) {
            clients.add(open());
        }
        AtomicBoolean stop = new AtomicBoolean(false);
        ConcurrentLinkedQueue<Long> grants = new ConcurrentLinkedQueue<>();
        first.getConnectionStateListenable().addListener((client, state) -> {
            say("STATE " + System.currentTimeMillis() + " " + state);
            noteSession(first);
        });
        List<Thread> threads = new ArrayList<>();
        for (CuratorFramework c : clients) {
            InterProcessMutex mutex = new InterProcessMutex(c, path);
            threads.add(new Thread(() -> {
                while (!stop.get()) {
                    try {
                        mutex.acquire();
                        grants.add(System.currentTimeMillis());
                        mutex.release();
                    } catch (InterruptedException e) {
                        return;
                    } catch (Exception e) {
                        try {
                            Thread.sleep(10);
                        } catch (InterruptedException e2) {
                            return;
                        }
                    }
                }
            }));
        }
        // The measured session's heartbeat: checkExists("/") every beatMs, each awaited beatMs.
        threads.add(new Thread(() -> {
            while (!stop.get()) {
                long sent = System.currentTimeMillis();
                CountDownLatch answered = new CountDownLatch(1);
                AtomicLong at = new AtomicLong();
                try {
                    first.checkExists().inBackground((client, event) -> {
                        if (event.getResultCode() == 0) {
                            at.set(System.currentTimeMillis());
                            answered.countDown();
                        }
                    }).forPath("/");
                    if (answered.await(beatMs, TimeUnit.MILLISECONDS)) {
                        say("BEAT " + at.get());
                    }
                } catch (InterruptedException e) {
                    return;
                } catch (Exception e) {
                    // Not answered: no BEAT.
                }
                noteSession(first);
                long rest = sent + beatMs - System.currentTimeMillis();
                if (rest > 0) {
                    try {
                        Thread.sleep(rest);
                    } catch (InterruptedException e) {
                        return;
                    }
                }
            }
        }));
        // Grants, batched.
        threads.add(new Thread(() -> {
            while (true) {
                StringBuilder line = new StringBuilder();
                Long t;
                while ((t = grants.poll()) != null) {
                    line.append(line.length() == 0 ? "GRANT " : " ").append(t);
                }
                if (line.length() > 0) {
                    say(line.toString());
                }
                if (stop.get()) {
                    return;
                }
                try {
                    Thread.sleep(20);
                } catch (InterruptedException e) {
                    // Stopping: one last drain.
                }
            }
        }));
        for (Thread t : threads) {
            t.setDaemon(true);
            t.start();
        }
        say("STARTED");
        while (true) {
            String line = stdin.readLine();
            if (line == null || line.trim().equals("STOP")) {
                break;
            }
        }
        stop.set(true);
        for (Thread t : threads) {
            t.interrupt();
        }
        for (Thread t : threads) {
            t.join(2_000);
        }
        for (CuratorFramework c : clients) {
            c.close();
        }
        say("STOPPED");
    }
}
