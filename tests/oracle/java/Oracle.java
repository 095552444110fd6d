import java.io.BufferedReader;
import java.io.ByteArrayOutputStream;
import java.io.File;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.lang.reflect.Constructor;
import java.lang.reflect.Field;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.net.URL;
import java.net.URLClassLoader;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Deque;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.concurrent.ConcurrentHashMap;

/**
 * Runs scenarios against RocketMQ's own producer classes and prints what they answer.
 *
 * <p>Usage: {@code java -cp <oracle classes> Oracle <rocketmq classpath>} with a script on
 * standard input, one command a line (see tests/oracle/script.py); every query prints one line and
 * {@code END} prints {@code END}. Everything is reached by reflection, so one build serves every
 * RocketMQ version. The classes of org.apache.rocketmq.client.latency are loaded with their calls
 * to System.currentTimeMillis() redirected to {@link OracleClock}, so time is exact.
 */
public final class Oracle {
    private static final String LATENCY_PACKAGE = "org.apache.rocketmq.client.latency.";

    private final ClassLoader loader;
    private final PrintStream out;

    private Object strategy;
    private Object tolerance;
    private Object publishInfo;
    private final ScriptedRandom random = new ScriptedRandom();
    private ConcurrentHashMap<String, Boolean> map;

    private Oracle(ClassLoader loader, PrintStream out) {
        this.loader = loader;
        this.out = out;
    }

    public static void main(String[] args) throws Exception {
        List<URL> urls = new ArrayList<>();
        for (String path : args[0].split(File.pathSeparator)) {
            if (!path.isEmpty()) {
                urls.add(new File(path).toURI().toURL());
            }
        }
        ClassLoader loader = new PatchingLoader(urls.toArray(new URL[0]), Oracle.class.getClassLoader());
        // RocketMQ logs to the console on some paths; keep stdout for answers only.
        PrintStream answers = new PrintStream(new java.io.FileOutputStream(java.io.FileDescriptor.out), false, "UTF-8");
        System.setOut(System.err);
        Oracle oracle = new Oracle(loader, answers);
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            line = line.trim();
            if (line.isEmpty()) {
                continue;
            }
            try {
                oracle.run(line.split(" "));
            } catch (InvocationTargetException e) {
                answers.println("ERR " + e.getCause().getClass().getSimpleName());
            }
        }
        answers.flush();
    }

    private void run(String[] cmd) throws Exception {
        switch (cmd[0]) {
            case "FAULT":
                newStrategy();
                break;
            case "ROUTE":
                newPublishInfo(cmd);
                break;
            case "ENABLE":
                call(strategy, "setSendLatencyFaultEnable", cmd[1].equals("1"));
                break;
            case "INDEX":
                setIndex(publishInfoIndex(), Integer.parseInt(cmd[1]));
                break;
            case "WORST":
                setIndex(worstIndex(), Integer.parseInt(cmd[1]));
                break;
            case "RAND":
                random.values.clear();
                for (int i = 1; i < cmd.length; i++) {
                    random.values.add(Integer.parseInt(cmd[i]));
                }
                break;
            case "CLOCK":
                OracleClock.now = Long.parseLong(cmd[1]);
                break;
            case "UPDATE":
                update(cmd[1], Long.parseLong(cmd[2]), cmd[3].equals("1"), cmd[4].equals("1"));
                break;
            case "SELECT":
                out.println(select(cmd[1].equals("-") ? null : cmd[1], cmd.length > 2 && cmd[2].equals("1")));
                break;
            case "AVAIL":
                out.println(call(tolerance, "isAvailable", cmd[1]));
                break;
            case "REACH":
                out.println(call(tolerance, "isReachable", cmd[1]));
                break;
            case "PICK":
                out.println(call(tolerance, "pickOneAtLeast"));
                break;
            case "REMOVE":
                call(tolerance, "remove", cmd[1]);
                break;
            case "ORDER":
                out.println(String.join(",", faultTable().keySet()));
                break;
            case "ITEM":
                item(cmd[1]);
                break;
            case "QUEUES":
                queues();
                break;
            case "IDX":
                out.println(indexValue(publishInfoIndex()));
                break;
            case "MAP":
                map = new ConcurrentHashMap<>(16);
                break;
            case "PUT":
                map.putIfAbsent(cmd[1], Boolean.TRUE);
                break;
            case "DEL":
                map.remove(cmd[1]);
                break;
            case "KEYS":
                out.println(String.join(",", map.keySet()));
                break;
            case "TABLE":
                Field table = ConcurrentHashMap.class.getDeclaredField("table");
                table.setAccessible(true);
                Object[] bins = (Object[]) table.get(map);
                out.println(bins == null ? 0 : bins.length);
                break;
            case "HASH":
                hash(Integer.parseInt(cmd[1]), cmd.length > 2 ? cmd[2] : "");
                break;
            case "END":
                out.println("END");
                out.flush();
                break;
            default:
                throw new IllegalArgumentException("unknown command " + cmd[0]);
        }
    }

    // -- the objects under test ------------------------------------------------------------

    private void newStrategy() throws Exception {
        Class<?> type = loader.loadClass(LATENCY_PACKAGE + "MQFaultStrategy");
        Constructor<?> plain = null;
        Constructor<?> modern = null;
        for (Constructor<?> c : type.getConstructors()) {
            if (c.getParameterCount() == 0) {
                plain = c;
            } else if (c.getParameterCount() == 3) {
                modern = c;
            }
        }
        if (plain != null) {
            strategy = plain.newInstance();
        } else {
            // 5.1.4+: MQFaultStrategy(ClientConfig, Resolver, ServiceDetector); no detector runs.
            Object config = loader.loadClass("org.apache.rocketmq.client.ClientConfig").getConstructor().newInstance();
            strategy = modern.newInstance(config, null, null);
        }
        tolerance = field(strategy, "latencyFaultTolerance");
        call(strategy, "setSendLatencyFaultEnable", true);
    }

    private void newPublishInfo(String[] cmd) throws Exception {
        String routePackage = routePackage();
        Object route = loader.loadClass(routePackage + "TopicRouteData").getConstructor().newInstance();
        List<Object> queueDatas = new ArrayList<>();
        List<Object> brokerDatas = new ArrayList<>();
        for (int i = 2; i < cmd.length; i++) {
            String[] b = cmd[i].split(":");
            Object qd = loader.loadClass(routePackage + "QueueData").getConstructor().newInstance();
            call(qd, "setBrokerName", b[0]);
            call(qd, "setReadQueueNums", Integer.parseInt(b[1]));
            call(qd, "setWriteQueueNums", Integer.parseInt(b[1]));
            call(qd, "setPerm", Integer.parseInt(b[2]));
            queueDatas.add(qd);
            Object bd = loader.loadClass(routePackage + "BrokerData").getConstructor().newInstance();
            call(bd, "setCluster", "c");
            call(bd, "setBrokerName", b[0]);
            HashMap<Long, String> addrs = new HashMap<>();
            addrs.put(0L, "127.0.0.1:10911");
            call(bd, "setBrokerAddrs", addrs);
            brokerDatas.add(bd);
        }
        call(route, "setQueueDatas", queueDatas);
        call(route, "setBrokerDatas", brokerDatas);
        Class<?> factory = loader.loadClass("org.apache.rocketmq.client.impl.factory.MQClientInstance");
        publishInfo = invoke(factory, null, "topicRouteData2TopicPublishInfo", cmd[1], route);
        Object index = publishInfoIndex();
        Field randomField = index.getClass().getDeclaredField("random");
        randomField.setAccessible(true);
        randomField.set(index, random);
    }

    private String routePackage() {
        for (String p : new String[] {"org.apache.rocketmq.remoting.protocol.route.", "org.apache.rocketmq.common.protocol.route."}) {
            try {
                loader.loadClass(p + "TopicRouteData");
                return p;
            } catch (ClassNotFoundException e) {
                // try the next
            }
        }
        throw new IllegalStateException("no TopicRouteData class on the classpath");
    }

    private void update(String broker, long latency, boolean isolation, boolean reachable) throws Exception {
        Method m4 = find(strategy.getClass(), "updateFaultItem", 4);
        if (m4 != null) {
            m4.invoke(strategy, broker, latency, isolation, reachable);
        } else {
            find(strategy.getClass(), "updateFaultItem", 3).invoke(strategy, broker, latency, isolation);
        }
    }

    private String select(String last, boolean reset) throws Exception {
        Method m3 = find(strategy.getClass(), "selectOneMessageQueue", 3);
        Object mq = m3 != null
            ? m3.invoke(strategy, publishInfo, last, reset)
            : find(strategy.getClass(), "selectOneMessageQueue", 2).invoke(strategy, publishInfo, last);
        return call(mq, "getBrokerName") + ":" + call(mq, "getQueueId");
    }

    private void item(String broker) throws Exception {
        Object item = faultTable().get(broker);
        out.println(item == null ? "null" : call(item, "getCurrentLatency") + ":" + call(item, "getStartTimestamp"));
    }

    private void queues() throws Exception {
        StringBuilder text = new StringBuilder();
        for (Object mq : (List<?>) call(publishInfo, "getMessageQueueList")) {
            if (text.length() > 0) {
                text.append(',');
            }
            text.append(call(mq, "getBrokerName")).append(':').append(call(mq, "getQueueId"));
        }
        out.println(text);
    }

    private void hash(int size, String hexUtf16) throws Exception {
        Class<?> mqType = loader.loadClass("org.apache.rocketmq.common.message.MessageQueue");
        List<Object> mqs = new ArrayList<>();
        for (int i = 0; i < size; i++) {
            mqs.add(mqType.getConstructor(String.class, String.class, int.class).newInstance("T", "b", i));
        }
        char[] units = new char[hexUtf16.length() / 4];
        for (int i = 0; i < units.length; i++) {
            units[i] = (char) Integer.parseInt(hexUtf16.substring(4 * i, 4 * i + 4), 16);
        }
        Object selector = loader.loadClass("org.apache.rocketmq.client.producer.selector.SelectMessageQueueByHash")
            .getConstructor().newInstance();
        Object mq = find(selector.getClass(), "select", 3).invoke(selector, mqs, null, new String(units));
        out.println(call(mq, "getQueueId"));
    }

    @SuppressWarnings("unchecked")
    private Map<String, Object> faultTable() throws Exception {
        return (Map<String, Object>) field(tolerance, "faultItemTable");
    }

    private Object publishInfoIndex() throws Exception {
        return call(publishInfo, "getSendWhichQueue");
    }

    /** whichItemWorst (4.x, 5.0.0, 5.1.4+) or randomItem (5.1.0-5.1.3): the one ThreadLocalIndex field. */
    private Object worstIndex() throws Exception {
        for (Field f : tolerance.getClass().getDeclaredFields()) {
            if (f.getType().getSimpleName().equals("ThreadLocalIndex")) {
                f.setAccessible(true);
                return f.get(tolerance);
            }
        }
        throw new IllegalStateException("no ThreadLocalIndex in " + tolerance.getClass());
    }

    @SuppressWarnings("unchecked")
    private static void setIndex(Object threadLocalIndex, int value) throws Exception {
        ((ThreadLocal<Integer>) field(threadLocalIndex, "threadLocalIndex")).set(value);
    }

    @SuppressWarnings("unchecked")
    private static Object indexValue(Object threadLocalIndex) throws Exception {
        return ((ThreadLocal<Integer>) field(threadLocalIndex, "threadLocalIndex")).get();
    }

    // -- reflection ---------------------------------------------------------------------------

    private static Object field(Object target, String name) throws Exception {
        for (Class<?> c = target.getClass(); c != null; c = c.getSuperclass()) {
            try {
                Field f = c.getDeclaredField(name);
                f.setAccessible(true);
                return f.get(target);
            } catch (NoSuchFieldException e) {
                // look in the superclass
            }
        }
        throw new NoSuchFieldException(name + " in " + target.getClass());
    }

    private static Method find(Class<?> type, String name, int arity) {
        for (Class<?> c = type; c != null; c = c.getSuperclass()) {
            for (Method m : c.getDeclaredMethods()) {
                if (m.getName().equals(name) && m.getParameterCount() == arity && !m.isBridge()) {
                    m.setAccessible(true);
                    return m;
                }
            }
        }
        return null;
    }

    private static Object call(Object target, String name, Object... args) throws Exception {
        return invoke(target.getClass(), target, name, args);
    }

    private static Object invoke(Class<?> type, Object target, String name, Object... args) throws Exception {
        Method m = find(type, name, args.length);
        if (m == null) {
            throw new NoSuchMethodException(name + "/" + args.length + " in " + type);
        }
        return m.invoke(target, args);
    }

    /** java.util.Random whose bounded draws come from the script (ThreadLocalIndex.reset). */
    static final class ScriptedRandom extends Random {
        final Deque<Integer> values = new ArrayDeque<>();

        @Override
        public int nextInt(int bound) {
            Integer v = values.poll();
            if (v == null) {
                throw new IllegalStateException("the script gave no RAND value for nextInt(" + bound + ")");
            }
            return v;
        }

        @Override
        public int nextInt() {
            return nextInt(Integer.MAX_VALUE);
        }
    }

    /**
     * Loads RocketMQ from its jars; for the fault classes it repoints the constant-pool Methodref
     * java/lang/System.currentTimeMillis()J at OracleClock.currentTimeMillis()J.
     */
    static final class PatchingLoader extends URLClassLoader {
        PatchingLoader(URL[] urls, ClassLoader parent) {
            super(urls, parent);
        }

        @Override
        protected Class<?> findClass(String name) throws ClassNotFoundException {
            if (!name.startsWith(LATENCY_PACKAGE)) {
                return super.findClass(name);
            }
            try (InputStream in = getResourceAsStream(name.replace('.', '/') + ".class")) {
                if (in == null) {
                    throw new ClassNotFoundException(name);
                }
                ByteArrayOutputStream buf = new ByteArrayOutputStream();
                in.transferTo(buf);
                byte[] patched = ClassPatch.redirectClock(buf.toByteArray());
                return defineClass(name, patched, 0, patched.length);
            } catch (java.io.IOException e) {
                throw new ClassNotFoundException(name, e);
            }
        }
    }

    /** A constant-pool edit: no bytecode changes, two constants appended. */
    static final class ClassPatch {
        static byte[] redirectClock(byte[] cls) {
            ByteBuffer b = ByteBuffer.wrap(cls);
            b.position(8);
            int count = b.getShort() & 0xffff;
            String[] utf8 = new String[count];
            int[] tag = new int[count];
            int[] a = new int[count];
            int[] c = new int[count];
            int[] at = new int[count];
            for (int i = 1; i < count; i++) {
                at[i] = b.position();
                tag[i] = b.get() & 0xff;
                switch (tag[i]) {
                    case 1:
                        byte[] s = new byte[b.getShort() & 0xffff];
                        b.get(s);
                        utf8[i] = new String(s, StandardCharsets.UTF_8);
                        break;
                    case 3: case 4:
                        b.getInt();
                        break;
                    case 5: case 6:
                        b.getLong();
                        i++;
                        break;
                    case 7: case 8: case 16: case 19: case 20:
                        a[i] = b.getShort() & 0xffff;
                        break;
                    case 9: case 10: case 11: case 12: case 17: case 18:
                        a[i] = b.getShort() & 0xffff;
                        c[i] = b.getShort() & 0xffff;
                        break;
                    case 15:
                        b.get();
                        b.getShort();
                        break;
                    default:
                        throw new IllegalStateException("constant tag " + tag[i]);
                }
            }
            int poolEnd = b.position();
            List<Integer> targets = new ArrayList<>();
            for (int i = 1; i < count; i++) {
                if (tag[i] == 10 && tag[a[i]] == 7 && "java/lang/System".equals(utf8[a[a[i]]])
                    && "currentTimeMillis".equals(utf8[a[c[i]]]) && "()J".equals(utf8[c[c[i]]])) {
                    targets.add(i);
                }
            }
            if (targets.isEmpty()) {
                return cls;
            }
            byte[] name = "OracleClock".getBytes(StandardCharsets.UTF_8);
            ByteBuffer o = ByteBuffer.allocate(cls.length + 3 + name.length + 3);
            o.put(cls, 0, 8);
            o.putShort((short) (count + 2));
            o.put(cls, 10, poolEnd - 10);
            o.put((byte) 1).putShort((short) name.length).put(name);
            o.put((byte) 7).putShort((short) count);
            o.put(cls, poolEnd, cls.length - poolEnd);
            byte[] out = o.array();
            for (int i : targets) {
                int pos = at[i] + 1; // class_index of the Methodref
                out[pos] = (byte) ((count + 1) >> 8);
                out[pos + 1] = (byte) (count + 1);
            }
            return out;
        }
    }
}
