public enum HopEnginePlaceholder {}
