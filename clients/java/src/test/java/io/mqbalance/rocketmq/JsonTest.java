package io.mqbalance.rocketmq;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

class JsonTest {
    @Test
    void parsesTheSidecarsShapes() {
        Map<String, Object> doc = Json.parseObject(
            "{\"generation\": 7, \"ok\": true, \"x\": null, \"f\": 1.5e3, \"s\": \"a\\\"b\\u00e9\", \"l\": [1, {\"k\": []}]}");
        assertEquals(7L, doc.get("generation"));
        assertEquals(Boolean.TRUE, doc.get("ok"));
        assertEquals(1500.0, doc.get("f"));
        assertEquals("a\"b\u00e9", doc.get("s"));
        assertEquals(List.of(1L, Map.of("k", List.of())), doc.get("l"));
    }

    @Test
    void quotesWhatItParses() {
        String s = "tab\there \"quoted\" \\ \u0001";
        assertEquals(s, Json.parse(Json.quote(s)));
    }

    @Test
    void badInputSaysWhere() {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> Json.parse("{\"a\" 1}"));
        assertEquals(true, e.getMessage().startsWith("bad JSON at 5: expected ':'"), e.getMessage());
        assertThrows(IllegalArgumentException.class, () -> Json.parse("[1,]"));
        assertThrows(IllegalArgumentException.class, () -> Json.parse("{} x"));
    }
}
